"""torch.compile for the engine's compiled regions, whose graphs a restart loads whole.

Inductor's and AOTAutograd's caches spare a restart the compiling, but Dynamo still traces every
region's Python again, at every start: most of a warm start. Dynamo's precompile (CompilePackage and
DiskDynamoStore, private APIs of the same shape in torch 2.10 to 2.15) saves what a region compiled
(its guards, bytecode and Inductor's output) and installs it at the next start, untraced. The
engine's regions are free functions whose modules, weights and state come in as arguments, which
is what that API can save.

What shapes this module:
- Guards are rebuilt at install with the grad mode in force then, not the one saved (torch issue
  175025, fixed in 2.14): packages install under inference mode, where the engine calls its regions.
- From torch 2.13, guards check a tensor's dimension marks (maybe_mark_dynamic, mark_static), and
  saved guards lose the marks they were compiled with, so a saved graph rejects a marked tensor. A
  region with an installed package is called unmarked first, with Dynamo told to fail rather than
  compile; only then are the dims marked for a compile. A stored region takes its marks off again
  after every call: they would reach another region's installed graphs through the tensors both
  read (the layers' weights: the decode step's and the prefill's).
- Guards on object identities (functions, classes, modules, closures) cannot be saved, and an entry
  holding one would not be: they are left out, in this process too. The regions read no such object
  that changes while the engine runs.
- Installed graphs are on the function's code object and serve every torch.compile of it, whatever
  its backend: a compile of the function with another backend uninstalls them.

A package that fails to load or install leaves its region tracing as without a store (one warning),
and so does one that fails to save, or a compile that fails for the package (then the region
compiles without one).
"""

from __future__ import annotations

import hashlib
import itertools
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from loguru import logger
from torch import Tensor

# The attributes torch's dimension marks live on (torch.compiler's mark_* and maybe_mark_dynamic).
DIMENSION_MARKS = ("_dynamo_dynamic_indices", "_dynamo_weak_dynamic_indices", "_dynamo_static_indices",
                   "_has_dynamo_dim_marking")
# The message of the error Dynamo raises under set_stance("fail_on_recompile") instead of compiling.
NOT_COMPILED = "Detected recompile when torch.compile stance is 'fail_on_recompile'"

Mark = Callable[[tuple], Iterable[Tensor]]  # marks the call's dims; returns the tensors it marked

_store_root: Path | None = None
_stored_only: frozenset | None = None  # in a compile helper: the code objects whose regions use the store
_regions: dict = {}  # code object -> its _StoredRegion (one a function in a process; see the module doc)
# Dynamo's stance is process-wide: while one stored region tries its installed graphs, another must
# not compile (it would fail). The engine calls every compiled region from its worker thread.
_stance_lock = threading.Lock()


def use_store(root: Path | None) -> None:
    """Keep compiled regions' packages under `root` (None: no store, regions trace at every start)."""
    global _store_root
    import torch._functorch.config as functorch_config

    # A package holds each graph's AOTAutograd entry with Inductor's output inside it.
    if root is not None and not hasattr(functorch_config, "bundled_autograd_cache"):
        logger.debug("torch {} cannot bundle AOTAutograd entries: compiled regions trace at every start",
                     torch.__version__)
        root = None
    _store_root = root
    if root is not None:
        functorch_config.bundled_autograd_cache = True


def store_only(functions: Iterable[Callable], name_offset: int) -> None:
    """In a compile helper's process (compile_helpers): only `functions`' regions load and save
    packages (the engine and the other helpers save the others'), and the globals Dynamo installs
    are numbered from `name_offset`, so that none has the name of one in another process's packages
    (a package installs its globals into the function's module, over any of the same name)."""
    global _stored_only
    from torch._dynamo import bytecode_transformation

    _stored_only = frozenset(fn.__code__ for fn in functions)
    bytecode_transformation._unique_id_counter = itertools.count(name_offset)


def installed(fn: Callable) -> bool | None:
    """Whether fn's stored region installed its graphs from the store; None where fn has none."""
    region = _regions.get(fn.__code__)
    return None if region is None else region.installed


def compile_region(fn: Callable, backend, mark: Mark = lambda args: ()) -> Callable:
    """fn through torch.compile (fullgraph, `backend`), with `mark` applied to every call's
    arguments before a compile. With a store (use_store) and a backend that names its compiled
    output (its store_key), the graphs persist from one start to the next; the same function and
    backend key again in this process give the same region."""
    key = getattr(backend, "store_key", None)
    region = _regions.get(fn.__code__)
    if region is not None and region.key == key:
        return region
    if region is not None:  # its installed graphs would serve this other backend's calls too
        region.uninstall()
    elif _store_root is not None and key is not None and (_stored_only is None or fn.__code__ in _stored_only):
        region = _regions[fn.__code__] = _StoredRegion(fn, backend, key, mark, _store_root / _package_name(fn, key))
        return region
    return _traced(torch.compile(fn, backend=backend, fullgraph=True), mark)


def _traced(compiled: Callable, mark: Mark) -> Callable:
    def run(*args):
        mark(args)
        return compiled(*args)

    return run


def _package_name(fn: Callable, backend_key: str) -> str:
    # Dynamo checks the traced source, the torch and Python versions and the GPU itself; the backend
    # (its Inductor settings and decompositions) only we know.
    name = f"{fn.__module__}.{fn.__qualname__}"
    return f"{name}-{hashlib.sha256(f'{name}|{backend_key}'.encode()).hexdigest()[:16]}"


def _serializable_guards(entries) -> list[bool]:
    from torch._dynamo.guards import CheckFunctionManager

    unsaved = CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    return [not (e.guard_type in unsaved or any(t in unsaved for t in e.derived_guard_types)) for e in entries]


def _compiles() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _count_past_installed_names(module) -> None:
    """Dynamo names the globals a trace installs in the traced function's module (its compiled
    graph, the builtins it reads) by one process-wide counter; a package installs those of the
    process that saved it, and a trace here would then make one of the same name (it fails:
    "already exists in scope"). Moves this process's counter past every number in them."""
    from torch._dynamo import bytecode_transformation

    numbers = [int(n) for name in vars(module) if name.startswith("__") for n in re.findall(r"_(\d+)", name)]
    if numbers and hasattr(bytecode_transformation, "_unique_id_counter"):
        start = max(next(bytecode_transformation._unique_id_counter), max(numbers) + 1)
        bytecode_transformation._unique_id_counter = itertools.count(start)


def _uninstall_partly_installed(package) -> None:
    if package is not None:
        try:
            package.uninstall()
        except Exception:  # noqa: BLE001 (nothing was installed, or nothing more can be done)
            pass


def _unmark(tensors: Iterable[Tensor]) -> None:
    for tensor in tensors:
        for attr in DIMENSION_MARKS:
            if hasattr(tensor, attr):
                delattr(tensor, attr)


class _StoredRegion:
    def __init__(self, fn: Callable, backend, key: str, mark: Mark, path: Path):
        from torch._dynamo.package import CompilePackage, DiskDynamoStore

        self.key, self._mark, self._name = key, mark, fn.__qualname__
        self._fn, self._backend = fn, backend
        self._saving = True  # compiled graphs go to the store (until a save or a compile for it fails)
        self._store, self._key, self._path = DiskDynamoStore(str(path.parent)), path.name, path
        self.installed, self._called = False, False
        self._tried = None  # the stored package's modification time when its install was last tried
        self._install_saved()
        if not self.installed:
            self._package = CompilePackage(fn)
            self._compiled = self._optimize(fn, backend, self._package)
        self._packaged = self._compiled

    def _install_saved(self) -> None:
        """Install the stored package, if there is one not tried yet (a warning where it does not load)."""
        try:
            version = (self._path / "entry").stat().st_mtime_ns
        except OSError:  # none stored
            return
        if version == self._tried:
            return
        self._tried = version
        started, package = time.perf_counter(), None
        try:
            with torch.inference_mode(), torch._inductor.config.patch(getattr(self._backend, "options", {})):
                package, backends = self._store.load_package(self._fn, self._key)
                compiled = self._optimize(self._fn, self._backend, package)
                package.install(backends)
            _count_past_installed_names(sys.modules[self._fn.__module__])
            self._package, self._compiled, self._packaged, self.installed = package, compiled, compiled, True
            logger.debug("compiled region {}: {} saved graphs installed in {:.2f} s", self._name, len(backends),
                         time.perf_counter() - started)
        except Exception as exc:  # torch changed, the source changed, a broken file: compile
            logger.warning("compiled region {}: its saved graphs did not load ({}: {}); tracing it again",
                           self._name, type(exc).__name__, str(exc)[:300])
            _uninstall_partly_installed(package)

    @staticmethod
    def _optimize(fn: Callable, backend, package) -> Callable:
        return torch._dynamo.optimize(backend=backend, nopython=True, package=package,
                                      guard_filter_fn=_serializable_guards)(fn)

    def __call__(self, *args):
        with _stance_lock:
            return self._call(args)

    def _call(self, args: tuple):
        if not self._called:
            self._called = True
            if not self.installed:  # a compile helper may have stored it since (compile_helpers)
                self._install_saved()
        if self.installed:
            try:
                with torch.compiler.set_stance("fail_on_recompile"):
                    return self._compiled(*args)
            except RuntimeError as exc:
                if NOT_COMPILED not in str(exc):
                    raise
        compiles = _compiles()
        marked = list(self._mark(args))
        try:
            result = self._compiled(*args)
        except torch._dynamo.exc.TorchDynamoException as exc:
            if self._compiled is not self._packaged:
                raise
            # A graph the package cannot hold (its guards pickle every input's metadata: a tensor
            # subclass may not) fails the compile itself: compile this region as without a store.
            logger.warning("compiled region {}: compiling it for the store failed ({}: {}); compiling it without",
                           self._name, type(exc).__name__, str(exc)[:300])
            self.uninstall()
            self._saving, self._compiled = False, torch.compile(self._fn, backend=self._backend, fullgraph=True)
            result = self._compiled(*args)
        finally:
            _unmark(marked)
        if self._saving and _compiles() != compiles:
            self._save()
        return result

    def uninstall(self) -> None:
        if self.installed:
            self.installed = False
            try:
                self._package.uninstall()
            except Exception as exc:  # noqa: BLE001 (private API: the graphs may stay installed)
                logger.warning("compiled region {}: its saved graphs stayed installed ({}: {})",
                               self._name, type(exc).__name__, str(exc)[:300])

    def _save(self) -> None:
        started = time.perf_counter()
        try:
            self._store.save_package(self._package, self._key)
            logger.debug("compiled region {}: graphs saved in {:.2f} s", self._name, time.perf_counter() - started)
        except Exception as exc:  # the region still runs; the next start traces it again
            logger.warning("compiled region {}: its graphs were not saved ({}: {}); it traces at every start",
                           self._name, type(exc).__name__, str(exc)[:300])
            self._saving = False  # it would fail again (torch 2.12, say, where no graph can be saved)
