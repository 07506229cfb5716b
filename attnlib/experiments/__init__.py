"""Per-chapter experiments modules, named like their notebooks (see DESIGN.md)."""
