"""Reading what is stored: archived pages as text (pagetext), part of an offloaded output (offloads), and the parts
of a split user turn beside a hit (neighbours)."""
