"""How latentkv's native CPU kernels are built, which instruction set serves, and what runs without them.

Each kernel family (attention.py, decode_ops.py, qlinear.py, sample.py beside this module) is one `Extension`:
- **Build:** on first use, by torch.utils.cpp_extension (ninja, the system's g++), from
  csrc/<family>/ with csrc/common/ on the include path, into
  `build_dir()/<family>` (rebuilt when a source changes). A first build takes FIRST_BUILD per
  extension; `build_in_background` overlaps them with other work (a first start's conversion).
- **Instruction set:** an extension compiles its loops for several ISAs (ISAS) in one library and
  reports which this CPU runs. Each of those is checked when the library is loaded (the self-check
  below); the best that passes serves, or LATENTKV_CPU_ISA's choice (an extension without that
  path runs its best one below it).
- **Self-check:** every ISA path this CPU runs is compared with the scalar path on a few small
  random inputs (the family's `probe`, milliseconds); a path that differs by more than the probe's
  stated tolerance is disabled with one warning naming it, and the next lower path serves.
  LATENTKV_SELFCHECK_BREAK=<family>:<isa> perturbs that path's results (the tests' way to see a
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
import warnings
from pathlib import Path
from typing import Callable

import torch

from ..user_cache import cache_root

CSRC = Path(__file__).parent / "csrc"
# avx512_bf16: with avx512_vnni, bf16 and int8 dot products; amx: with AMX bf16 tiles (qlinear's bf16 linears)
ISAS = {"scalar": 0, "avx2": 1, "avx512": 2, "avx512_bf16": 3, "amx": 4}
FIRST_BUILD = "30-70 s"  # g++ time of one extension's first build on a 2-core machine (qlinear the longest)
CFLAGS = ["-O3", "-fopenmp", "-ffp-contract=fast"]

# probe(module, isa code) -> [(label, output, tolerance)]: the same inputs on every path; a path
# passes where max|out - scalar out| <= tolerance * max(1, max|scalar out|) for every output.
Probe = Callable[[object, int], list]


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


def isa_name(code: int) -> str:
    return next(name for name, c in ISAS.items() if c == code)


def forced_isa() -> int | None:
    """LATENTKV_CPU_ISA as a code (None when unset); an unknown name is an error."""
    forced = os.environ.get("LATENTKV_CPU_ISA")
    if not forced:
        return None
    if forced not in ISAS:
        raise ValueError(f"LATENTKV_CPU_ISA={forced!r}: expected one of {list(ISAS)}")
    return ISAS[forced]


class Extension:
    """One kernel family's library: built once per process, its ISA paths self-checked, one fallback.
    `state` (published in one update, so the hot path reads it without the lock): module, reason,
    runs (the CPU's ISA codes), isas (those that passed the self-check), disabled ({code: why}), isa
    (the code that serves)."""

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

    def supported_isas(self) -> list[str]:
        """The ISA paths that serve here: this CPU runs them and they passed the self-check."""
        return [isa_name(code) for code in self.state["isas"]] if self.available() else []

    def isa(self) -> int:
        """The code of the path that serves (the extension must be available)."""
        self.module()
        return self.state["isa"]

    def choose(self) -> str:
        """The path that serves under LATENTKV_CPU_ISA as it is now (see choose_isa)."""
        self.module()
        return choose_isa(self.state["runs"], self.state["isas"])

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
            state["runs"] = list(module.supported_isas())
            state["disabled"] = self_check(self, module, state["runs"])
            state["isas"] = [code for code in state["runs"] if code not in state["disabled"]]
            state["module"] = module
            state["isa"] = ISAS[choose_isa(state["runs"], state["isas"])]
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
        for code, why in state["disabled"].items():  # once the module is in place (an error filter cannot undo it)
            below = max(c for c in state["isas"] if c < code)
            warnings.warn(
                f"latentkv: {self.name}'s {isa_name(code)} path disagrees with its scalar path ({why}); "
                f"disabled, {isa_name(below)} serves",
                RuntimeWarning,
                stacklevel=4,
            )


def choose_isa(runs: list[int], isas: list[int]) -> str:
    """LATENTKV_CPU_ISA's path (or the best below it, where an extension lacks it or the self-check
    disabled it), else the best of `isas` (the paths that passed). Forcing a path this CPU does not
    run is an error."""
    forced = forced_isa()
    if forced is None:
        return isa_name(isas[-1])
    if forced <= max(runs) and forced not in runs:
        raise ValueError(f"LATENTKV_CPU_ISA={isa_name(forced)!r}: this CPU runs only {[isa_name(c) for c in runs]}")
    return isa_name(max(code for code in isas if code <= forced))


def self_check(ext: Extension, module, runs: list[int]) -> dict[int, str]:
    """{code: why} for each of `runs`' paths above scalar whose probe outputs differ from the scalar
    path's beyond tolerance."""
    broken = os.environ.get("LATENTKV_SELFCHECK_BREAK", "")
    disabled: dict[int, str] = {}
    with torch.no_grad(), torch.device("cpu"):  # the first load may happen while a model is built on "meta"
        reference = ext.probe(module, 0)
        for code in runs:
            if code == 0:
                continue
            outputs = ext.probe(module, code)
            if broken == f"{ext.family}:{isa_name(code)}":
                outputs = [(label, out + 1.0, tol) for label, out, tol in outputs]
            for (label, ref, tol), (_, out, _) in zip(reference, outputs):
                ref, out = ref.double(), out.double()
                error = (out - ref).abs().max().item() if ref.numel() else 0.0
                if not error <= tol * max(1.0, ref.abs().max().item()):  # NaN fails too
                    disabled[code] = f"{label}: error {error:.3g} beyond {tol:g}"
                    break
    return disabled


def compile_extension(name: str, source: Path, directory: Path):
    """Build (or load the cached build of) one extension, with the flags they all share; its family's
    folder and csrc/common are the include path. Raises if it cannot be built."""
    ensure_ninja()
    # Optional heavy import: cpp_extension pulls in setuptools and is only needed to build.
    from torch.utils.cpp_extension import load

    directory.mkdir(parents=True, exist_ok=True)
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
