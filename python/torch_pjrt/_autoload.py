"""The ``torch.backends`` entry point of installs made before it moved to
the top-level module ``_torch_pjrt_autoload`` (whose guard also covers the
package's own import). Kept so that their metadata keeps loading."""


def load() -> None:
    import torch_pjrt  # noqa: F401  (already imported: loading this module imported the package)
