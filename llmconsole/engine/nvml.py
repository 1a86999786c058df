"""NVML (nvidia-ml-py, imported as `pynvml`), initialised once per process, lazily, by whichever
thread asks first; every caller (the host probe, the planner's device and topology reads) goes
through here.

`nvmlInit` is not free (it opens the driver, or fails to find it), and a host with no GPU fails it
the same way every time: the outcome, success or the error, is kept, and never tried again in this
process. Every call turns any error (no library, no driver, a call the device does not support)
into None, printed as "N/A": a missing value is a value, and a host with no GPU shows N/A gauges,
never a traceback.
"""

from __future__ import annotations

import threading
from typing import Any


def _import_pynvml() -> Any | None:
    """pynvml, imported at the first NVML call rather than with this module: every `llmconsole`
    command imports the host probe, and most never read a GPU."""
    try:  # nvidia-ml-py is a dependency, but a broken install must not stop the console
        import pynvml
    except Exception:  # pragma: no cover - exercised only on broken installs
        return None
    return pynvml


class Nvml:
    """One NVML library's state in this process: whether it initialised, and why not."""

    def __init__(self, module: Any | None, *, load: bool = False) -> None:
        self.module = module
        self._load = load  # import pynvml at the first call (the process's instance)
        self._lock = threading.Lock()
        self._ready: bool | None = None  # None: not tried yet
        self._error: str | None = None

    def ready(self) -> bool:
        """Whether NVML is usable; initialises it on the first call only (of any thread)."""
        if self._ready is None:
            with self._lock:
                if self._ready is None:
                    self._ready, self._error = self._init()
        return bool(self._ready)

    def _init(self) -> tuple[bool, str | None]:
        if self._load:
            self.module = _import_pynvml()
        if self.module is None:
            return False, "nvidia-ml-py is not importable"
        try:
            self.module.nvmlInit()
        except Exception as e:
            return False, f"{type(e).__name__}: {e}"
        return True, None

    @property
    def error(self) -> str | None:
        """Why NVML is not usable (None when it is, or has not been tried)."""
        return self._error

    def call(self, name: str, *args: object) -> Any | None:
        """pynvml.<name>(*args), or None when NVML is not usable or the call fails."""
        if not self.ready():
            return None
        try:
            return getattr(self.module, name)(*args)
        except Exception:
            return None

    def name_text(self, handle: object) -> str | None:
        """A device's name as text (older pynvml releases return bytes)."""
        name = self.call("nvmlDeviceGetName", handle) if handle is not None else None
        return name.decode() if isinstance(name, bytes) else name


NVML = Nvml(None, load=True)  # the process's one instance
