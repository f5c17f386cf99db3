"""The test suite: pytest imports its modules as the package ``tests`` (from the repository root), so
tests share helpers as ``tests.<module>``; code shared with scripts/ is ``ort_torch_compat.testing``."""
