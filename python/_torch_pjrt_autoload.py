"""Target of torch-pjrt's ``torch.backends`` entry point: torch calls
``load()`` inside ``import torch`` and turns any exception of it into a failed
``import torch``.

It lives outside the ``torch_pjrt`` package so that loading the entry point
runs nothing of the package: ``load()`` guards the package's whole import.
The package is written not to raise at import (no plugin, runtime or
environment is read; a stale extension is reported at first use); should it
raise anyway, ``import torch`` still succeeds, with a warning, and
``import torch_pjrt`` shows the error in full. No module-level imports, so
that ``import torch_pjrt`` before ``import torch`` (torch, then this, then
the half-initialized package) does not recurse."""


def load() -> None:
    try:
        import torch_pjrt  # noqa: F401  (registration happens on import)
    except Exception as e:  # never fail `import torch` because of torch-pjrt
        import warnings

        warnings.warn(f"torch-pjrt could not be loaded, the pjrt device is unavailable: {type(e).__name__}: {e} "
                      "(`import torch_pjrt` shows the full error; TORCH_DEVICE_BACKEND_AUTOLOAD=0 skips loading it)",
                      RuntimeWarning, stacklevel=2)
