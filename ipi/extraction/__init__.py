"""Hidden-state extraction: replayed rows, the frozen-backbone predict module and the cache."""
