"""``extract.prefix_reuse``: its allowed values, read without importing torch (the config check uses it)."""

from __future__ import annotations

#: ``extract.prefix_reuse`` values (docs/extraction.md).
PREFIX_REUSE_MODES: tuple[str, ...] = ("auto", "true", "false")


def resolve_prefix_reuse(value) -> str:
    """``extract.prefix_reuse`` as one of :data:`PREFIX_REUSE_MODES` (Hydra parses true/false as bools).

    Raises:
        ValueError: Any other value.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    v = str(getattr(value, "value", value)).strip().lower()
    if v not in PREFIX_REUSE_MODES:
        raise ValueError(f"extract.prefix_reuse={value!r}; allowed: {', '.join(PREFIX_REUSE_MODES)}")
    return v
