"""Per-chapter figures modules, named like their notebooks (see DESIGN.md)."""
