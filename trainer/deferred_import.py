"""A module that MaxText imports but a job rarely uses, imported when it is
first used instead of when MaxText is imported.

MaxText 0.2.5's ``maxtext/trainers/pre_train/train.py`` imports
``maxtext.common.vertex_tensorboard`` at its top, which imports
``cloud_accelerator_diagnostics`` and, through it, ``google.cloud.aiplatform``:
about 2 of the ~8 CPU-seconds of importing MaxText (``python -X importtime``
here: 2.1 s of 7.5 s), paid by every training worker at every start and
restart. Only ``use_vertex_tensorboard=true`` calls into it, and only inside
functions (``aiplatform.init``, ``aiplatform.Tensorboard``...).

``defer(name)`` puts a stand-in for ``name`` in ``sys.modules``: an
``import`` or ``from ... import`` of it finds the stand-in and runs nothing.
The first attribute read through it (a function, a class, a submodule's
``__path__``) imports the real module, which from then on is in
``sys.modules``, and the stand-in hands on every read to it. Nothing is
faked: the real module answers every use. (importlib's LazyLoader does not
serve here: the import statement itself reads ``__spec__`` from the module
it finds, and that read loads a LazyLoader module at once.)

``defer(name, package=True)`` also gives the stand-in the package's own
``__path__``: its submodules import without its ``__init__``, which waits
for the first read of one of its own names (``from PACKAGE import NAME``
reads one). Only for a package whose ``__init__`` gathers its submodules'
names and does nothing else: tokamax 0.2's, whose ``__init__`` imports
every kernel of the library (~1.2 of MaxText's ~6 CPU-seconds here) while
MaxText's import needs one of its submodules
(``maxtext/layers/attention_op.py``: ``from tokamax._src.ops.attention
import base``).

Beside the trainer in the job's working directory, shipped as it is."""
from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types

_LOCK = threading.RLock()


class Deferred(types.ModuleType):
    """Stands in for a module not yet imported; its first attribute read
    imports the real one."""

    def __init__(self, name: str, spec, package: bool = False) -> None:
        super().__init__(name, f"stands in for {name} until its first use")
        # What `import` and importlib.util.find_spec read: the real module's
        # spec (not initializing), so neither loads it. No __path__ (unless
        # ``package``): a submodule's import reads it, and that loads the
        # real package first.
        self.__spec__, self.__loader__, self.__file__ = spec, spec.loader, spec.origin
        self.__package__ = spec.parent
        if package:
            self.__path__ = list(spec.submodule_search_locations)
            self.__package__ = name
        self.__dict__["_deferred_real"] = None

    def _deferred_load(self) -> types.ModuleType:
        with _LOCK:
            real = self.__dict__["_deferred_real"]
            if real is None:
                if sys.modules.get(self.__name__) is self:
                    del sys.modules[self.__name__]
                try:
                    real = importlib.import_module(self.__name__)
                except BaseException:
                    sys.modules.setdefault(self.__name__, self)  # a later use tries again
                    raise
                # A package's submodules imported through the stand-in are
                # its attributes there: the real package's too.
                for key, value in list(self.__dict__.items()):
                    if isinstance(value, types.ModuleType) and value.__name__ == f"{self.__name__}.{key}" \
                            and key not in real.__dict__:
                        setattr(real, key, value)
                self.__dict__["_deferred_real"] = real
            return real

    def __getattr__(self, attr: str):
        # Only attributes the stand-in lacks come here (not its name, doc,
        # spec, loader, file or package).
        return getattr(self._deferred_load(), attr)


def defer(name: str, package: bool = False) -> bool:
    """Stand in for ``name`` until its first use: True if it now does;
    False where it is already imported or not installed (nothing to defer).
    ``package``: its submodules import without it (above)."""
    with _LOCK:
        if name in sys.modules:
            return False
        parent, _, child = name.rpartition(".")
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return False
        if spec is None or spec.loader is None or (package and spec.submodule_search_locations is None):
            return False
        stand_in = Deferred(name, spec, package)
        sys.modules[name] = stand_in
        if parent and parent in sys.modules and not hasattr(sys.modules[parent], child):
            setattr(sys.modules[parent], child, stand_in)
        return True


def loaded(name: str) -> bool:
    """The real module is imported (not a stand-in still waiting)."""
    m = sys.modules.get(name)
    return m is not None and not (isinstance(m, Deferred) and m.__dict__["_deferred_real"] is None)
