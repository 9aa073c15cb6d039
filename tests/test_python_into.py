#!/usr/bin/python3
"""test_python_into.py - ckpt.load / Checkpointer.restore with into=: the
saved arrays read in place into the caller's own (a live model's and
optimizer's state), no second copy of the state.

Run by meson (test 'python_into', suite 'python') like test_python.py,
whose helpers it uses. Exits 77 (meson: SKIP) when python3 lacks numpy or
torch.

What it checks: a model and optimizer restored with
into=training_state(model, optimizer) hold the saved values in their own
tensors (the very objects come back, parameters included) and resume
bit-identically; every array that does not match exactly (shape, dtype,
non-contiguous, read-only, quantized, missing, the second of two tied
names) is allocated anew, with the saved value, and the caller's array
is left alone; a damaged chunk still raises CorruptError.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_python import Base, same, tensor_bytes, tmpdir  # noqa: E402

import unittest  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ckpt  # noqa: E402
from ckpt.pytorch import load_training_state, training_state  # noqa: E402


def model_and_opt(seed):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(),
                            torch.nn.Linear(96, 8))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    x = torch.randn(16, 64)
    m(x).square().mean().backward()
    opt.step()  # Adam's moments exist
    opt.zero_grad()
    return m, opt


def ptrs(state):
    out = {}

    def walk(x, path):
        if isinstance(x, torch.Tensor):
            out[path] = x.data_ptr()
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, path + "/" + str(k))
    walk(state, "")
    return out


class Into(Base):
    def test_model_and_optimizer_in_place(self):
        m1, o1 = model_and_opt(1)
        c = self.open()
        c.save(5, training_state(model=m1, optimizer=o1, step=5),
               wait=True)
        m2, o2 = model_and_opt(2)
        self.assertNotEqual(tensor_bytes(m1[0].weight),
                            tensor_bytes(m2[0].weight))
        mine = training_state(model=m2, optimizer=o2)
        want = ptrs({"model": mine["model"],
                     "optimizer": mine["optimizer"]["state"]})
        got = c.restore(5, into=mine)
        # the model's and Adam's own memory now holds step 5's values
        self.assertEqual(tensor_bytes(m2[0].weight),
                         tensor_bytes(m1[0].weight))
        self.assertEqual(tensor_bytes(o2.state[o2.param_groups[0]
                                               ["params"][0]]["exp_avg"]),
                         tensor_bytes(o1.state[o1.param_groups[0]
                                               ["params"][0]]["exp_avg"]))
        self.assertEqual(ptrs({"model": got["model"],
                               "optimizer": got["optimizer"]["state"]}),
                         want)
        for k, v in mine["model"].items():
            self.assertIs(got["model"][k], v, k)
        same(self, training_state(model=m1, optimizer=o1)["model"],
             got["model"])
        # and the usual call on top of it resumes identically
        load_training_state(got, model=m2, optimizer=o2)
        self.assertEqual(got["step"], 5)
        x = torch.randn(16, 64, generator=torch.Generator().manual_seed(3))
        for m, o in ((m1, o1), (m2, o2)):
            m(x).square().mean().backward()
            o.step()
        for a, b in zip(m1.parameters(), m2.parameters()):
            self.assertEqual(tensor_bytes(a), tensor_bytes(b))

    def test_what_does_not_match_is_allocated(self):
        g = torch.Generator().manual_seed(4)
        saved = {"ok": torch.randn(8, 8, generator=g),
                 "shape": torch.randn(8, 8, generator=g),
                 "dtype": torch.randn(8, 8, generator=g),
                 "strided": torch.randn(8, 8, generator=g),
                 "np": np.arange(12, dtype=np.float32).reshape(3, 4),
                 "np_ro": np.arange(6, dtype=np.int64),
                 "np_type": np.arange(6, dtype=np.int64),
                 "gone": torch.ones(3),
                 "tied_a": torch.randn(5, generator=g),
                 "tied_b": torch.randn(5, generator=g),
                 "q": torch.quantize_per_tensor(torch.rand(4, generator=g),
                                                0.1, 3, torch.quint8)}
        c = self.open()
        c.save(1, saved, wait=True)
        tied = torch.zeros(5)
        ro = np.zeros(6, dtype=np.int64)
        ro.flags.writeable = False
        mine = {"ok": torch.zeros(8, 8),
                "shape": torch.zeros(8, 9),
                "dtype": torch.zeros(8, 8, dtype=torch.float64),
                "strided": torch.zeros(8, 8).t(),
                "np": np.zeros((3, 4), dtype=np.float32),
                "np_ro": ro,
                "np_type": np.zeros(6, dtype=np.int32),
                "extra": torch.zeros(2),
                "tied_a": tied, "tied_b": tied,
                "q": torch.quantize_per_tensor(torch.zeros(4), 0.1, 3,
                                               torch.quint8)}
        before = {k: (tensor_bytes(v) if isinstance(v, torch.Tensor)
                      else v.tobytes()) for k, v in mine.items()}
        got = c.restore(1, into=mine)
        same(self, saved, got)
        self.assertIs(got["ok"], mine["ok"])
        self.assertIs(got["np"], mine["np"])
        # one of two names for the same memory gets it (which one
        # depends on the order the tree is walked in), the other a copy
        self.assertEqual(sorted([got["tied_a"] is tied,
                                 got["tied_b"] is tied]), [False, True])
        for k in ("shape", "dtype", "strided", "np_ro", "np_type", "q"):
            self.assertIsNot(got[k], mine[k], k)
            now = mine[k]
            now = tensor_bytes(now) if isinstance(now, torch.Tensor) \
                else now.tobytes()
            self.assertEqual(now, before[k], k)
        self.assertEqual(tensor_bytes(mine["extra"]), before["extra"])
        self.assertNotIn("extra", got)

    def test_load_into_and_damage(self):
        d = tmpdir(self)
        big = torch.randn(1 << 18, generator=torch.Generator().manual_seed(5))
        c = self.open(d, codec="none")
        c.save(1, {"w": big}, wait=True)
        c.close()
        dst = torch.zeros_like(big)
        got = ckpt.load(d, 1, into={"w": dst})
        self.assertIs(got["w"], dst)
        self.assertTrue(torch.equal(dst, big))
        step = os.path.join(d, [n for n in os.listdir(d)
                                if n.startswith("step-")][0])
        shard = os.path.join(step, sorted(n for n in os.listdir(step)
                                          if n.endswith(".shard"))[0])
        with open(shard, "r+b") as f:
            f.seek(os.path.getsize(shard) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x40]))
        with self.assertRaises(ckpt.CorruptError) as e:
            ckpt.load(d, 1, into={"w": torch.zeros_like(big)})
        self.assertIn("checksum", str(e.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
