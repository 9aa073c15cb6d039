#!/usr/bin/python3
"""train_torch.py - a small PyTorch training run that checkpoints with
ckpt, survives a TPU VM's maintenance stop and resumes bit-identically.
Run it under `ckptctl run`:

    ckptctl run --location /ckpt/run1 --remote gs://BUCKET/run1 -- \\
        python3 examples/train_torch.py

Design note. The model is an MLP classifier (LayerNorm, GELU, dropout)
trained with AdamW on synthetic data: each step draws a batch from
torch's RNG, labels it with a fixed random "teacher", flips a few labels
with numpy's RNG and augments with Python's `random`, so a resumed run is
bit-identical to an uninterrupted one only if the parameters, the
optimizer's state and all three RNG states come back exactly
(ckpt.pytorch.training_state / load_training_state). --mib sets the
state's size (parameters plus AdamW's two moments: 12 bytes a
parameter); a few hundred MiB is fine, the default is quick.

The loop asks ckpt two cheap questions per step:
  c.should_save(step)  a reason when a save is due: "periodic" (--every
                       N steps), or a notice from the metadata server
                       ("maintenance", "preempted", "upcoming") or SIGTERM;
                       c.save() takes the reason from it, so the engine
                       plans a notice's save against the deadline. A
                       notice's save is waited for (nothing is computed
                       that the stop would throw away) and, with a remote,
                       its upload is given the rest of the window;
  c.should_exit()      the notice's save is durable: exit with
                       ckpt.EXIT_RESTART (75); `ckptctl run` restarts the
                       program once the VM is back, with CKPT_RESUME_STEP.
Environment (from `ckptctl run`): CKPT_LOCATION (none: no checkpoints,
the reference run), CKPT_REMOTE (its Cloud Storage copy: steps are
uploaded, and a notice's save may go straight there when the engine
measured the bucket faster than the disk), CKPT_RESUME_STEP and
CKPT_RESUME_LOCATION (where that step is), CKPT_RESTART_COUNT;
GCE_METADATA_HOST and STORAGE_EMULATOR_HOST as for Google's clients.
One line per event, as examples/train.c prints them:
  train: start pid=P resume=S restart=R     train: resumed S FROM
  train: step S loss=L                      train: save S REASON
  train: durable S SECONDS                  train: uploaded S SECONDS
  train: stop S                             train: done S digest=HEX
"""

import argparse
import hashlib
import os
import random
import sys
import time

import numpy as np
import torch

import ckpt
from ckpt.pytorch import load_training_state, training_state

IN, CLASSES, BATCH = 64, 10, 32


def build_model(mib):
    """An MLP of three hidden layers of width h: about 2h^2 parameters,
    12 bytes each with AdamW's moments."""
    params = mib * (1 << 20) // 12
    h = max(16, int((params / 2) ** 0.5))
    layers = []
    for i in range(3):
        layers += [torch.nn.Linear(IN if i == 0 else h, h),
                   torch.nn.LayerNorm(h), torch.nn.GELU(),
                   torch.nn.Dropout(0.1)]
    return torch.nn.Sequential(*layers, torch.nn.Linear(h, CLASSES))


def batch(teacher):
    x = torch.randn(BATCH, IN)
    if random.random() < 0.5:               # augmentation: Python's RNG
        x = -x
    y = (x @ teacher).argmax(dim=1)
    flip = np.random.rand(BATCH) < 0.05     # label noise: numpy's RNG
    y[torch.from_numpy(flip)] = torch.randint(0, CLASSES,
                                              (int(flip.sum()),))
    return x, y


def digest(model, opt, step):
    """SHA-256 of every tensor of the model's and optimizer's state."""
    h = hashlib.sha256(str(step).encode())
    for sd in (model.state_dict(), opt.state_dict()["state"]):
        for k in sorted(sd, key=str):
            vals = sd[k].values() if isinstance(sd[k], dict) else [sd[k]]
            for v in vals:
                if torch.is_tensor(v):
                    h.update(v.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def open_checkpointer(args, loc, remote):
    return ckpt.Checkpointer(
            loc, remote=remote, every_steps=args.every, watch=True,
            sigterm=True, keep_last=3, maintenance_window_ms=args.window_ms,
            staging_bytes=max(args.mib, 4) << 20)


def save(c, step, why, state):
    t0 = time.time()
    print("train: save %d %s" % (step, why))
    if why == "periodic":
        c.save(step, state)                 # staged; training goes on
        return
    c.save(step, state, wait=True)          # durable before the next step
    print("train: durable %d %.3f" % (step, time.time() - t0))
    left = why.deadline - time.time() - 1.0 if why.deadline else 0
    if c.remote and left > 0:
        try:
            c.upload_wait(timeout=left)
            print("train: uploaded %d %.3f" % (step, time.time() - t0))
        except ckpt.CkptError as e:         # it resumes after the restart
            print("train: upload of %d goes on after the restart (%s)"
                  % (step, e))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=16, help="state size")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=50,
                    help="periodic save every N steps (0: off)")
    ap.add_argument("--step-ms", type=int, default=0,
                    help="extra time per step (a slower model)")
    ap.add_argument("--window-ms", type=int, default=60000,
                    help="maintenance notice window (a TPU VM: 60 s)")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # a line per event
    env = os.environ.get
    loc, remote = env("CKPT_LOCATION") or None, env("CKPT_REMOTE") or None
    resume = env("CKPT_RESUME_STEP") or None
    print("train: start pid=%d resume=%s restart=%s" % (
        os.getpid(), resume or "-",
        env("CKPT_RESTART_COUNT", "-")), flush=True)

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    random.seed(args.seed)
    teacher = torch.randn(IN, CLASSES)
    model = build_model(args.mib)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    # the watcher first, so a notice during the restore is not missed
    c = open_checkpointer(args, loc, remote) if loc else None
    if c and resume:
        where = env("CKPT_RESUME_LOCATION") or loc
        saved = (c.restore(int(resume)) if where == loc else
                 ckpt.load(where, int(resume)))
        state = load_training_state(saved, model=model, optimizer=opt)
        step = state["step"]
        print("train: resumed %d %s" % (step, where))

    while step < args.steps:
        step += 1
        x, y = batch(teacher)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print("train: step %d loss=%.4f" % (step, loss.item()))
        why = c.should_save(step) if c else None
        if why:
            save(c, step, why, training_state(model=model, optimizer=opt,
                                              step=step))
        if c and c.should_exit():
            print("train: stop %d" % step, flush=True)
            c.close()
            return ckpt.EXIT_RESTART
        if args.step_ms:
            time.sleep(args.step_ms / 1000)

    if c:   # the final state, unless that step is saved already
        c.wait()
        if c.latest_step() != step:
            c.save(step, training_state(model=model, optimizer=opt,
                                        step=step), wait=True)
        if c.remote:
            c.upload_wait()
        c.close()
    print("train: done %d digest=%s" % (step, digest(model, opt, step)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
