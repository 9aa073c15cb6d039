#!/usr/bin/python3
"""test_demo_fails: examples/demo.py fails, naming the step of its story,
when a training loop breaks the story.

    test_demo_fails.py BUILDDIR

Design note. Each case makes a build directory of its own whose
tools/ckptctl and engine/libckpt.so are the real ones and whose
examples/train is a shell wrapper around the real examples/train that
breaks one thing, runs `demo.py --quick --trainer c` on it, and checks
that the demo exits 1 and says "demo FAILED at step N" for the step
whose check should catch it:
  deaf      the trainer never hears the metadata server: no early
            checkpoint (step 4);
  old       the restart resumes from an older step than the notice's
            (step 6: not resumed at the next step);
  differs   the reference run trains another state: the digests differ
            (step 7).
A short window (6 s) keeps it quick; nothing is timed. Skipped (77)
without /usr/bin/python3's servers or the C example.
"""

import os
import subprocess
import sys
import tempfile

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = {
    "deaf": ("4", 'export GCE_METADATA_HOST=127.0.0.1:1\n'),
    "old": ("6", 'if [ "$CKPT_RESTART_COUNT" = 1 ]; then\n'
            '  export CKPT_RESUME_STEP=10 CKPT_RESUME_LOCATION=\n'
            'fi\n'),
    "differs": ("7", 'if [ -z "$CKPT_LOCATION" ]; then\n'
                '  set -- "$@" --mib 9\n'
                'fi\n'),
}


def fake_build(real, tmp, name, breakage):
    root = os.path.join(tmp, name)
    for sub in ("tools", "engine", "examples"):
        os.makedirs(os.path.join(root, sub))
    for rel in ("tools/ckptctl", "engine/libckpt.so"):
        os.symlink(os.path.join(real, rel), os.path.join(root, rel))
    wrapper = os.path.join(root, "examples", "train")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\n# %s\n%sexec %s \"$@\"\n" % (
            name, breakage, os.path.join(real, "examples", "train")))
    os.chmod(wrapper, 0o755)
    return root


def main():
    real = os.path.abspath(sys.argv[1])
    if not os.path.exists(os.path.join(real, "examples", "train")):
        print("no examples/train in %s" % real)
        return 77
    bad = 0
    with tempfile.TemporaryDirectory(prefix="ckpt-demo-fails.") as tmp:
        for name, (step, breakage) in CASES.items():
            build = fake_build(real, tmp, name, breakage)
            r = subprocess.run(
                    ["/usr/bin/python3", os.path.join(SRC, "examples",
                                                      "demo.py"),
                     "--quick", "--trainer", "c", "--window", "6",
                     "--build", build, "--workdir",
                     os.path.join(tmp, name + "-work")],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    timeout=600)
            err = r.stderr.decode("utf-8", "replace")
            said = [x for x in err.splitlines() if "demo FAILED" in x]
            ok = r.returncode == 1 and said and \
                said[0].startswith("demo FAILED at step %s " % step)
            print("%-8s exit %d, %s: %s" % (name, r.returncode,
                                            said[0] if said else
                                            "no failure reported",
                                            "ok" if ok else "WRONG"))
            if not ok:
                bad += 1
                print(r.stdout.decode("utf-8", "replace")[-3000:])
                print(err[-3000:])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
