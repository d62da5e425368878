"""Builds and loads the native kernels in ``csrc/`` (``torch.ops.chatpage.*``), once per process.

The first call to :func:`available` (or :func:`load`) compiles the extension with
``torch.utils.cpp_extension`` into ``$XDG_CACHE_HOME/chatpage/torch_extensions/<name>`` (default
``~/.cache``), where ``<name>`` carries a hash of every file under ``csrc/``, the compiler flags,
the torch and Python versions and the CPU's features: a changed source gets a fresh build, an
unchanged one is loaded straight from the cached ``.so`` (milliseconds). While it compiles, one
line is reported (to stderr, or to the callback given to :func:`set_notify`, for a TUI).

Anything that goes wrong (no compiler, no ninja, a build error, a library that will not load) is
reported in one line and the engine keeps running on the torch reference in
``engine/model/attention.py``; :func:`status` says which path is live and why. ``CHATPAGE_NO_KERNELS=1``
forces the reference; ``CHATPAGE_KERNEL_CACHE=DIR`` keeps the builds in DIR instead;
``CHATPAGE_KERNEL_BUILD=avx2`` (or ``no-amx``) loads that test build (:data:`TEST_BUILDS`) instead
of the native one, and :func:`vector_isa` answers for it: an AVX2 machine's kernels and cut-overs
on an AVX-512 one (torch's own kernels still take the whole CPU unless told, e.g.
``DNNL_MAX_CPU_ISA=AVX2``). CUDA sources
are compiled only when torch has CUDA and sees a GPU; if only they fail, the CPU kernels are still
used.

``python -m chatpage.engine.model.ops --build`` builds (or loads) the extension and prints its status.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from chatpage.config.paths import cache_dir

ENV_DISABLE = "CHATPAGE_NO_KERNELS"
# Where the built kernels are cached, when not under the XDG cache (a benchmark that gives each
# load a fresh XDG cache keeps the kernels built once this way)
ENV_CACHE = "CHATPAGE_KERNEL_CACHE"
BUILD_MESSAGE = "chatpage: building native attention kernels (first run, ~1 min)..."
BUILD_MESSAGE_CUDA = "chatpage: building native attention kernels with CUDA (first run, ~3 min)..."
CSRC = Path(__file__).resolve().parents[3] / "csrc"

_RECIPE = 1  # bump when the way the extension is built changes
_CFLAGS = ("-O3", "-march=native", "-fopenmp", "-DNDEBUG")
_LDFLAGS = ("-fopenmp",)
# The build of an AVX2 machine on this one (no AVX-512 of any kind): what the kernels' AVX2 paths
# are tested with (tests/kernels/test_gemm.py), in a process of its own.
AVX2_CFLAGS = (*_CFLAGS, "-mno-avx512f")
# The build of an AVX-512 machine without AMX (Zen 4) on this one: the GEMMs' fp32-FMA path
# (tests/kernels/test_gemm.py); on a CPU without AMX, the same as the native build.
NO_AMX_CFLAGS = (*_CFLAGS, "-mno-amx-tile")
# The builds the tests run beside this machine's own, each in a process of its own, by name.
TEST_BUILDS = {"avx2": AVX2_CFLAGS, "no-amx": NO_AMX_CFLAGS}
# The process's build instead of the native one (a name of TEST_BUILDS), and what vector_isa()
# answers at most with it
ENV_BUILD = "CHATPAGE_KERNEL_BUILD"
_BUILD_ISA = {"avx2": "avx2", "no-amx": "avx512"}
_ISA_ORDER = ("portable", "avx2", "avx512", "amx")
_CUDA_CFLAGS = ("-O3", "-DNDEBUG")
_STALE_LOCK_S = 15 * 60  # a build lock older than this was left by a killed build

Notify = Callable[[str], None]


def _default_notify(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cache_root() -> Path:
    """``$CHATPAGE_KERNEL_CACHE`` when set, else ``$XDG_CACHE_HOME/chatpage/torch_extensions``
    (``~/.cache`` when that is unset)."""
    override = os.environ.get(ENV_CACHE)
    return Path(override) if override else cache_dir() / "torch_extensions"


def _cpu_features() -> str:
    """The CPU feature list the code is compiled for (-march=native makes the build CPU-specific)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def vector_isa() -> str:
    """The vector paths this CPU's build of the kernels takes (``-march=native``): ``"amx"``
    (AVX-512 with AMX's bf16 tiles, which Linux grants this process: the GEMMs' tile path),
    ``"avx512"`` (AVX-512 F, BW, VL, BF16 and VNNI: the GEMVs' 16-lane paths, the q8 GEMMs),
    ``"avx2"`` (AVX2 + FMA: vec.h's eight lanes) or ``"portable"``. What the kernels' speed, and so
    the cut-overs between them (``engine/model/weights.py``), depend on."""
    flags = set(_cpu_features().split())
    cap = _BUILD_ISA.get(os.environ.get(ENV_BUILD, "").strip(), "amx")
    if {"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni"} <= flags:
        # torch asks Linux for the tiles' state as the kernels do (arch_prctl), once per process
        amx = cap == "amx" and {"amx_tile", "amx_bf16"} <= flags and torch._C._cpu._init_amx()
        isa = "amx" if amx else "avx512"
    else:
        isa = "avx2" if {"avx2", "fma"} <= flags else "portable"
    return min(isa, cap, key=_ISA_ORDER.index)


def _first_error_line(text: str) -> str:
    """The most useful single line of a compiler or loader error."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for marker in ("error:", "not found", "no such file"):  # compiler/linker/shell formats
        hits = [ln for ln in lines if marker in ln.lower()]
        if hits:
            return hits[0][:300]
    return (lines[-1] if lines else "unknown error")[:300]


def _loaded_elsewhere(library: Path) -> str | None:
    """Path of a chatpage kernel library this process already loaded, if it is not ``library``."""
    mine = os.path.realpath(library)
    for path in torch.ops.loaded_libraries:
        if "chatpage_kernels_" in os.path.basename(path) and os.path.realpath(path) != mine:
            return str(path)
    return None


class KernelLoader:
    """Compiles/loads one copy of the extension; thread-safe, does its work at most once.

    The module keeps one instance; tests may build their own over other sources (``csrc``),
    another cache directory (``cache_dir``) or other compiler flags (``cflags``, e.g.
    :data:`AVX2_CFLAGS`: the build's name carries them, so each set has its own cached library).
    """

    def __init__(
        self, csrc: Path = CSRC, cache_dir: Path | None = None, cflags: tuple[str, ...] = _CFLAGS
    ) -> None:
        self.csrc = Path(csrc)
        self.cache_dir = cache_dir
        self.cflags = cflags
        self._lock = threading.Lock()
        self._done = False
        self._devices: frozenset[str] = frozenset()
        self._status = "not loaded"
        self._notify: Notify | None = None

    # -- public -----------------------------------------------------------------------------

    def set_notify(self, callback: Notify | None) -> None:
        """Send the build/fallback lines to ``callback`` instead of stderr (None: stderr)."""
        self._notify = callback

    def available(self, device: torch.device | str) -> bool:
        """True when the native ops are loaded for ``device``'s type (loads on first call)."""
        if not self._done:
            self.load()
        kind = device.type if isinstance(device, torch.device) else torch.device(device).type
        return kind in self._devices

    def status(self) -> str:
        """``"native"``, ``"native (cpu only: <why>)"``, ``"reference: <why>"`` or ``"not loaded"``."""
        return self._status

    def devices(self) -> frozenset[str]:
        """Device types with native ops (empty before loading or on the reference path)."""
        return self._devices

    def load(self, verbose: bool = False) -> bool:
        """Build/load the extension if that has not been tried yet; True when the CPU ops are native."""
        if not self._done:
            with self._lock:
                if not self._done:
                    try:
                        self._load(verbose)
                    except Exception as exc:  # never let the kernels take the app down
                        self._fall_back(
                            f"unexpected {type(exc).__name__}: {_first_error_line(str(exc))}"
                        )
                    self._done = True
        return "cpu" in self._devices

    # -- internals --------------------------------------------------------------------------

    def _say(self, message: str) -> None:
        (self._notify or _default_notify)(message)

    def _fall_back(self, why: str) -> None:
        self._devices = frozenset()
        self._status = f"reference: {why}"
        self._say(f"chatpage: native kernels unavailable ({why}); using the torch reference")

    def _want_cuda(self) -> bool:
        return bool(torch.version.cuda) and torch.cuda.is_available()

    def _load(self, verbose: bool) -> None:
        if os.environ.get(ENV_DISABLE, "").strip().lower() in ("1", "true", "yes", "on"):
            self._status = f"reference: {ENV_DISABLE} is set"
            return
        build = os.environ.get(ENV_BUILD, "").strip()
        if build and build not in TEST_BUILDS:
            self._fall_back(f"{ENV_BUILD}={build} is not one of {', '.join(TEST_BUILDS)}")
            return
        if not (self.csrc / "ops.cpp").is_file():
            self._fall_back(f"sources not found at {self.csrc}")
            return
        errors: list[str] = []
        if self._want_cuda():
            try:
                self._build(cuda=True, verbose=verbose)
                self._devices = frozenset({"cpu", "cuda"})
                self._status = "native"
                return
            except Exception as exc:
                why = _first_error_line(str(exc))
                errors.append(why)
                self._say(
                    f"chatpage: CUDA kernels failed to build ({why}); trying the CPU kernels alone"
                )
        try:
            self._build(cuda=False, verbose=verbose)
        except Exception as exc:
            errors.append(_first_error_line(str(exc)))
            self._fall_back("build failed: " + errors[-1])
            return
        self._devices = frozenset({"cpu"})
        self._status = "native" if not errors else f"native (cpu only: {errors[0]})"

    def _sources(self, cuda: bool) -> list[Path]:
        sources = [self.csrc / "ops.cpp", *sorted((self.csrc / "cpu").glob("*.cpp"))]
        if cuda:
            sources += sorted((self.csrc / "cuda").glob("*.cu"))
            sources += sorted((self.csrc / "cuda").glob("*.cpp"))
        return sources

    def _name(self, cuda: bool) -> str:
        h = hashlib.sha256()
        for path in sorted(p for p in self.csrc.rglob("*") if p.is_file()):
            h.update(str(path.relative_to(self.csrc)).encode())
            h.update(path.read_bytes())
        for part in (
            _RECIPE,
            self.cflags,
            _LDFLAGS,
            _CUDA_CFLAGS,
            cuda,
            torch.__version__,
            torch.version.cuda,
            sys.version,
            _cpu_features(),
            os.environ.get("TORCH_CUDA_ARCH_LIST", ""),
        ):
            h.update(repr(part).encode())
        return f"chatpage_kernels_{'cuda' if cuda else 'cpu'}_{h.hexdigest()[:16]}"

    def _build(self, cuda: bool, verbose: bool) -> None:
        name = self._name(cuda)
        build_dir = (self.cache_dir or cache_root()) / name
        library = build_dir / f"{name}.so"
        other = _loaded_elsewhere(library)
        if other:  # a second TORCH_LIBRARY(chatpage) would abort the process
            raise RuntimeError(
                f"error: another chatpage kernel library is already loaded ({other})"
            )
        if library.is_file():
            try:
                torch.ops.load_library(str(library))
                return
            except Exception:  # a half-written library from a killed build: rebuild it
                library.unlink(missing_ok=True)
        build_dir.mkdir(parents=True, exist_ok=True)
        lock = build_dir / "lock"
        if lock.exists() and time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
            lock.unlink(missing_ok=True)
        self._say(BUILD_MESSAGE_CUDA if cuda else BUILD_MESSAGE)
        from torch.utils import cpp_extension  # slow import, only when compiling

        try:
            cpp_extension.load(
                name=name,
                sources=[str(p) for p in self._sources(cuda)],
                # copies: cpp_extension appends to the lists it is given
                extra_cflags=list(self.cflags),
                extra_cuda_cflags=list(_CUDA_CFLAGS) if cuda else None,
                extra_ldflags=list(_LDFLAGS),
                extra_include_paths=[str(self.csrc)],
                build_directory=str(build_dir),
                verbose=verbose,
                with_cuda=cuda,
                is_python_module=False,
            )
        except Exception as exc:
            (build_dir / "build.log").write_text(str(exc), encoding="utf-8")
            raise


_BUILD = os.environ.get(ENV_BUILD, "").strip()
# a test build where the tests keep it (tests/kernel_checks.py: run_other_build), built once
_LOADER = (
    KernelLoader(cache_dir=cache_root() / _BUILD, cflags=TEST_BUILDS[_BUILD])
    if _BUILD in TEST_BUILDS
    else KernelLoader()
)

# `python -m chatpage.engine.model.ops` runs this file a second time as __main__ after the package
# import has already loaded it (engine/__init__ -> attention -> ops); runpy warns about exactly
# that. main() below works through the package's copy, so the warning is noise.
warnings.filterwarnings(
    "ignore", message="'chatpage.engine.model.ops' found in sys.modules", category=RuntimeWarning
)


def available(device: torch.device | str) -> bool:
    """True when the native ops are loaded for ``device`` (the first call builds/loads them)."""
    return _LOADER.available(device)


def load(verbose: bool = False) -> bool:
    """Build/load the extension now (idempotent); True when the CPU ops are native."""
    return _LOADER.load(verbose)


def status() -> str:
    """Which attention path is live: ``"native"``, ``"native (cpu only: ...)"``,
    ``"reference: <why>"``, or ``"not loaded"`` before the first :func:`available`/:func:`load`."""
    return _LOADER.status()


def set_notify(callback: Notify | None) -> None:
    """Route the one-line build/fallback messages to ``callback`` (e.g. a TUI status bar)."""
    _LOADER.set_notify(callback)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chatpage.engine.model.ops", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--build", action="store_true", help="build (or load) the extension now")
    parser.add_argument("--verbose", action="store_true", help="show the compiler's output")
    args = parser.parse_args(argv)
    if not args.build:
        parser.print_help()
        return 0
    t0 = time.perf_counter()
    native = load(verbose=args.verbose)
    print(f"chatpage kernels: {status()} ({time.perf_counter() - t0:.1f} s)")
    disabled = status().startswith(f"reference: {ENV_DISABLE}")
    return 0 if native or disabled else 1


if __name__ == "__main__":
    from chatpage.engine.model import ops as _package_copy  # one loader per process, not two

    sys.exit(_package_copy.main())
