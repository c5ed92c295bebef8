"""How latentkv's native CPU kernels are built, which instruction set serves, and what runs without them.

Each kernel family (attention.py, decode_ops.py, qlinear.py, sample.py beside this module) is one `Extension`:
- **Build:** on first use, by torch.utils.cpp_extension (ninja, the system's g++), from
  csrc/<family>/ with csrc/common/ on the include path, into
  `build_dir()/<family>` (rebuilt when a source changes). A first build takes FIRST_BUILD per
  extension; `build_in_background` overlaps them with other work (a first start's conversion).
- **Instruction sets:** named capabilities (CAPS: avx2, avx512, avx512_vnni, ...; no order among
  them), each a bit of the mask every kernel entry takes (csrc/common/cpu_isa.h). A family compiles
  its paths (one unit per ISA), each named by the capability it adds and needing a set of them, and
  reports them with the capabilities this CPU has. The set that serves is chosen once, when the
  library loads: this CPU's, less what LATENTKV_CPU_ISA leaves out (a PROFILES name, or capability
  names joined by ","), less the paths the self-check disables; every entry of the family is handed
  it (`Extension.caps`) and runs the best of its paths that set allows.
- **Self-check:** every path this CPU runs is compared with the scalar path on a few small random
  inputs (the family's `probe`, milliseconds, under the capabilities the path needs); a path that
  differs by more than the probe's stated tolerance is disabled (its capability leaves the family's
  set) with one warning naming it, and the best path left serves.
  LATENTKV_SELFCHECK_BREAK=<family>:<path> perturbs that path's results (the tests' way to see a
  wrong path caught).
- **Fallback:** no compiler, no ninja, a failed build, or the family's switch set to 0: `module()` is
  None, `unavailable_reason()` says why, and (unless switched off on purpose) one RuntimeWarning
  names what runs instead.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..user_cache import cache_root

CSRC = Path(__file__).parent / "csrc"
# The capability names, bit i of a kernel's mask the i-th (csrc/common/cpu_isa.h CAP_NAMES: checked at load)
CAPS = ("avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
# LATENTKV_CPU_ISA's profiles: (the capabilities each needs of the CPU, those it allows where the CPU has them)
PROFILES = {
    "scalar": ((), ()),
    "avx2": (("avx2",), ()),
    "avx512": (("avx2", "avx512"), ("avx512_vnni",)),
    "avx512_bf16": (("avx2", "avx512", "avx512_bf16"), ("avx512_vnni",)),
    "amx": (("avx2", "avx512", "avx512_bf16", "amx_bf16"), ("avx512_vnni", "amx_int8")),
}
STALE_LOCK_S = 30 * 60  # a build lock older than this was left by a killed build (a build takes minutes at most)
FIRST_BUILD = "30-70 s"  # g++ time of one extension's first build on a 2-core machine (qlinear the longest)
CFLAGS = ["-O3", "-fopenmp", "-ffp-contract=fast"]

# probe(module, caps mask) -> [(label, output, tolerance)]: the same inputs on every path; a path
# passes where max|out - scalar out| <= tolerance * max(1, max|scalar out|) for every output.
Probe = Callable[[object, int], list]


@dataclass(frozen=True)
class Capabilities:
    """A set of capability names (CAPS) and the mask the kernels take for it (bit i: CAPS[i])."""

    names: frozenset[str]
    mask: int

    @classmethod
    def of(cls, names) -> "Capabilities":
        names = frozenset(names)
        unknown = sorted(names - set(CAPS))
        if unknown:
            raise ValueError(f"unknown capabilities {unknown}: expected names of {list(CAPS)}")
        return cls(names, sum(1 << CAPS.index(name) for name in names))

    @classmethod
    def of_mask(cls, mask: int) -> "Capabilities":
        return cls.of(name for i, name in enumerate(CAPS) if mask >> i & 1)

    def __le__(self, other: "Capabilities") -> bool:
        return self.names <= other.names

    def __and__(self, other: "Capabilities") -> "Capabilities":
        return Capabilities.of(self.names & other.names)

    def __or__(self, other: "Capabilities") -> "Capabilities":
        return Capabilities.of(self.names | other.names)

    def __sub__(self, other: "Capabilities") -> "Capabilities":
        return Capabilities.of(self.names - other.names)

    def __str__(self) -> str:
        return ",".join(name for name in CAPS if name in self.names) or "scalar"


NONE = Capabilities.of(())


def build_root() -> Path:
    """$LATENTKV_BUILD_DIR, else torch_extensions/ in the user cache (user_cache.cache_root())."""
    override = os.environ.get("LATENTKV_BUILD_DIR")
    return Path(override) if override else cache_root() / "torch_extensions"


def build_dir() -> Path:
    """One build folder per Python, torch and checkout: two installs of latentkv on one machine
    (a clone and a venv, two worktrees) would otherwise rebuild over each other's loaded library."""
    checkout = hashlib.sha1(str(CSRC.resolve()).encode()).hexdigest()[:8]
    return (
        build_root() / f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__.split('+')[0]}-{checkout}"
    )


def allowed_caps(cpu: Capabilities) -> Capabilities:
    """The capabilities LATENTKV_CPU_ISA allows of this CPU's: all where it is unset; a PROFILES name's, or
    the capability names it joins by ",". An unknown name, or one that needs a capability this CPU lacks,
    is an error."""
    forced = os.environ.get("LATENTKV_CPU_ISA")
    if not forced:
        return cpu
    if forced in PROFILES:
        needs, optional = (Capabilities.of(names) for names in PROFILES[forced])
    else:
        try:
            needs, optional = Capabilities.of(forced.split(",")), NONE
        except ValueError:
            raise ValueError(
                f"LATENTKV_CPU_ISA={forced!r}: expected one of {list(PROFILES)}, or names of {list(CAPS)} joined by ','"
            ) from None
    if not needs <= cpu:
        raise ValueError(f"LATENTKV_CPU_ISA={forced!r} needs {needs - cpu}, which this CPU lacks (it has {cpu})")
    return needs | (optional & cpu)


class Extension:
    """One kernel family's library: built once per process, its paths self-checked, one fallback.
    `state` (published in one update, so the hot path reads it without the lock): module, reason,
    cpu (this CPU's Capabilities), paths ({path: the Capabilities it needs}, scalar first), runs (the
    paths this CPU runs), disabled ({path: why}), caps (the Capabilities that serve: every entry of
    the family is handed `caps.mask`), path (the best path they allow)."""

    def __init__(self, family: str, name: str, source: str, switch: str, what: str, fallback: str, probe: Probe):
        self.family, self.name, self.source, self.switch = family, name, CSRC / family / source, switch
        self.what, self.fallback, self.probe = what, fallback, probe
        self.state: dict = {}
        self.lock = threading.Lock()  # one build per process, even when a background thread started it

    def module(self):
        """The compiled module, or None (the reason in `unavailable_reason()`). The first caller builds
        under the lock (a background thread may be doing it: others wait)."""
        if "module" in self.state:
            return self.state["module"]
        with self.lock:
            if "module" not in self.state:
                built: dict = {}
                self._build(built)
                self.state.update(built)
            return self.state["module"]

    def available(self) -> bool:
        return self.module() is not None

    def unavailable_reason(self) -> str | None:
        self.module()
        return self.state["reason"]

    @property
    def caps(self) -> Capabilities:
        """The capabilities that serve (the extension must be available): the one way a kernel gets them."""
        try:
            return self.state["caps"]
        except KeyError:  # not loaded yet (a failed load has no caps: KeyError again)
            self.module()
            return self.state["caps"]

    def path_caps(self, path: str) -> Capabilities:
        """The capabilities one of this family's paths needs (scalar: none)."""
        self.module()
        return self.state["paths"][path]

    def serves(self, path: str) -> bool:
        """Whether the capabilities that serve allow `path` (available, and that path passed the self-check)."""
        return self.available() and self.state["paths"][path] <= self.caps

    def supported_isas(self) -> list[str]:
        """The paths that serve here, scalar first: this CPU runs them and they (and the paths they
        build on) passed the self-check."""
        if not self.available():
            return []
        passed = self.state["cpu"] - Capabilities.of(self.state["disabled"])
        return [path for path in self.state["runs"] if self.state["paths"][path] <= passed]

    def choose(self) -> str:
        """The best path the capabilities that serve allow (chosen when the library loaded)."""
        self.module()
        return self.state["path"]

    def _build(self, state: dict) -> None:
        state["module"], state["reason"] = None, None
        try:
            if os.environ.get(self.switch, "1") == "0":
                raise RuntimeError(f"disabled by {self.switch}=0")
            directory = build_dir() / self.family
            if not (directory / f"{self.name}.so").exists():
                print(
                    f"latentkv: building {self.what.rsplit(' ', 1)[0]} into {directory} (once, {FIRST_BUILD})",
                    file=sys.stderr,
                    flush=True,
                )
            module = compile_extension(self.name, self.source, directory)
            unknown = [path for path, _ in module.paths() if path not in CAPS]
            if unknown:  # a path is named by the capability it adds: the self-check disables that one
                raise RuntimeError(f"paths {unknown} are named by no capability of {list(CAPS)}")
            bits = dict(module.capabilities())
            if bits != {name: 1 << i for i, name in enumerate(CAPS)}:
                raise RuntimeError(f"the library's capabilities {bits} are not build.CAPS (build from one checkout)")
            state["cpu"] = Capabilities.of_mask(module.cpu_capabilities())
            state["paths"] = {"scalar": NONE, **{path: Capabilities.of_mask(m) for path, m in module.paths()}}
            state["runs"] = [path for path, needs in state["paths"].items() if needs <= state["cpu"]]
            state["disabled"] = self_check(self, module, state["paths"], state["runs"])
            state["caps"] = allowed_caps(state["cpu"]) - Capabilities.of(state["disabled"])
            state["path"] = best_path(state["paths"], state["caps"])
            state["module"] = module
        except Exception as err:  # no compiler, no ninja, a failed build: the fallback takes over
            state["module"] = None
            state["reason"] = failure_reason(err)
            if f"{self.switch}=0" not in state["reason"]:
                warnings.warn(
                    f"latentkv: {self.what} unavailable ({state['reason']}); using {self.fallback} (correct, slower)",
                    RuntimeWarning,
                    stacklevel=4,
                )
            return
        for path, why in state["disabled"].items():  # once the module is in place (an error filter cannot undo it)
            warnings.warn(
                f"latentkv: {self.name}'s {path} path disagrees with its scalar path ({why}); "
                f"disabled, {state['path']} serves",
                RuntimeWarning,
                stacklevel=4,
            )


def best_path(paths: dict[str, Capabilities], caps: Capabilities) -> str:
    """The last of `paths` (in the family's order: each after those it improves on) that `caps` allow."""
    return [path for path, needs in paths.items() if needs <= caps][-1]


def self_check(ext: Extension, module, paths: dict[str, Capabilities], runs: list[str]) -> dict[str, str]:
    """{path: why} for each of `runs` but scalar whose probe outputs, under the capabilities the path
    needs, differ from the scalar path's beyond tolerance."""
    broken = os.environ.get("LATENTKV_SELFCHECK_BREAK", "")
    disabled: dict[str, str] = {}
    with torch.no_grad(), torch.device("cpu"):  # the first load may happen while a model is built on "meta"
        reference = ext.probe(module, 0)
        for path in runs:
            if path == "scalar":
                continue
            outputs = ext.probe(module, paths[path].mask)
            if broken == f"{ext.family}:{path}":
                outputs = [(label, out + 1.0, tol) for label, out, tol in outputs]
            for (label, ref, tol), (_, out, _) in zip(reference, outputs):
                ref, out = ref.double(), out.double()
                error = (out - ref).abs().max().item() if ref.numel() else 0.0
                if not error <= tol * max(1.0, ref.abs().max().item()):  # NaN fails too
                    disabled[path] = f"{label}: error {error:.3g} beyond {tol:g}"
                    break
    return disabled


def compile_extension(name: str, source: Path, directory: Path):
    """Build (or load the cached build of) one extension, with the flags they all share; its family's
    folder and csrc/common are the include path. Raises if it cannot be built."""
    ensure_ninja()
    # Optional heavy import: cpp_extension pulls in setuptools and is only needed to build.
    from torch.utils.cpp_extension import load

    directory.mkdir(parents=True, exist_ok=True)
    check_build_lock(directory, name)
    # every .cpp of the family's folder: a family split into units per ISA builds them in parallel
    sources = [str(source)] + sorted(str(p) for p in source.parent.glob("*.cpp") if p != source)
    return load(
        name=name,
        sources=sources,
        build_directory=str(directory),
        extra_cflags=CFLAGS,
        extra_ldflags=["-fopenmp"],
        extra_include_paths=[str(CSRC / "common"), str(source.parent)],
        verbose=False,
    )


def check_build_lock(directory: Path, name: str, stale: float = STALE_LOCK_S) -> None:
    """cpp_extension's `lock` file in the build folder marks a build in progress, and a later build waits
    for it to go, silently and for ever: a build that was killed leaves it behind. Say who waits on what;
    remove one older than `stale` seconds (no build takes that long)."""
    lock = directory / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > stale:
        lock.unlink(missing_ok=True)
        print(f"latentkv: removed {lock}, left {age / 60:.0f} min ago by a build that did not finish", file=sys.stderr)
    else:
        print(
            f"latentkv: waiting for another build of {name} ({lock}, {age:.0f} s old); "
            "if no latentkv build is running, delete that file",
            file=sys.stderr,
            flush=True,
        )


def failure_reason(err: Exception) -> str:
    """One line saying why an extension is unavailable (its type and the last line of its message)."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[-1] if text else ''}"


def ensure_ninja() -> None:
    """cpp_extension runs `ninja` from PATH; the `ninja` wheel (a dependency) puts it next to python."""
    if shutil.which("ninja"):
        return
    here = Path(sys.executable).parent
    try:
        import ninja  # optional: only its binary's folder is needed

        os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{here}{os.pathsep}{os.environ.get('PATH', '')}"
    except ImportError:
        os.environ["PATH"] = f"{here}{os.pathsep}{os.environ.get('PATH', '')}"


def build_in_background(*extensions: Extension) -> list[threading.Thread]:
    """Build each extension in its own daemon thread, now: a first build (FIRST_BUILD each) then
    overlaps the caller's work and the other builds instead of stalling the first forward pass.
    A later `module()` waits for its thread's build (the lock)."""
    threads = [
        threading.Thread(target=ext.module, daemon=True, name=f"latentkv-build-{ext.family}") for ext in extensions
    ]
    for thread in threads:
        thread.start()
    return threads
