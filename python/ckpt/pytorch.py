"""ckpt.pytorch: a PyTorch training state in one checkpoint, and back.

    from ckpt.pytorch import training_state, load_training_state
    c.save(step, training_state(model=model, optimizer=opt, step=step))
    ...
    mine = training_state(model=model, optimizer=opt)
    state = load_training_state(c.restore(into=mine), model=model,
                                optimizer=opt)
    start = state["step"] + 1

(into= reads the saved tensors straight into the model's parameters and
the optimizer's moments where they match: no second copy of the state.)

Design note. A resumed run is bit-identical to one that never stopped
when everything that decides the next steps comes back exactly: the
model's parameters and buffers (model.state_dict()), the optimizer's
per-parameter state and param groups (optimizer.state_dict(): int keys,
tensors, ints, floats, bools, tuples, None), the learning-rate
scheduler's state if any, and every random number generator the loop
draws from: torch's CPU generator (and CUDA's when present), numpy's
global RandomState and Python's `random`. The checkpoint stores them as
they are (tensors zero-copy, dtypes exact, tuples as tuples); nothing is
converted to float on the way.
"""

import random

import numpy as np
import torch


def rng_state():
    """The RNG states of torch, numpy (global) and Python's random."""
    st = {"torch": torch.get_rng_state(),
          "numpy": np.random.get_state(),
          "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st):
    """Restores what rng_state() returned."""
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def training_state(model=None, optimizer=None, step=None, extra=None,
                   scheduler=None):
    """A dict to pass to Checkpointer.save(): {"model", "optimizer",
    "rng", "step", "extra"} (and "scheduler" when given). The tensors are
    the live ones (no copy): save() stages them before it returns.

    save(..., borrow=True) skips that staging copy, and is safe when
    nothing writes to the saved memory before c.wait_released():
      - a model and optimizer on a GPU or TPU (CUDA, XLA): save() makes
        the host copy of each tensor itself and only the engine reads it
        (the RNG states are always copies too); safe as it is;
      - CPU tensors: the optimizer's step (and a forward pass updating
        buffers, as batch norm's in training mode, load_state_dict, ...)
        writes the very memory the engine reads, so call
        c.wait_released() before the next of these, or leave borrow
        off."""
    st = {"model": model.state_dict() if model is not None else None,
          "optimizer": (optimizer.state_dict() if optimizer is not None
                        else None),
          "rng": rng_state(), "step": step, "extra": extra}
    if scheduler is not None:
        st["scheduler"] = scheduler.state_dict()
    return st


def load_training_state(state, model=None, optimizer=None, scheduler=None,
                        rng=True):
    """Loads what training_state() saved (as Checkpointer.restore()
    returned it) into model, optimizer and scheduler, and restores the RNG
    states (rng=False leaves them). Returns `state`, so the caller reads
    state["step"] and state["extra"]."""
    if model is not None:
        model.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    if rng:
        set_rng_state(state["rng"])
    return state
