"""Target of the ``torch.backends`` entry point: torch calls ``load()`` at
the end of ``import torch``. It must import nothing at module level, so that
``import torch_pjrt`` before ``import torch`` (which imports torch, which
autoloads us) does not recurse into a half-initialized package."""


def load() -> None:
    import torch_pjrt  # noqa: F401  (registration happens on import)
