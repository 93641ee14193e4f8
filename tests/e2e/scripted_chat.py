"""The scripted chat the real engines' tests replay: short questions on many topics, two facts stated early and one
of them looked up in plain words later; and a reader of the proxy's /metrics text."""

from __future__ import annotations

TOPICS = ["maple trees", "the moon", "bread baking", "sailing", "chess openings", "volcanoes", "honey bees",
          "old lighthouses", "jazz drummers", "desert foxes", "paper making", "glaciers", "coffee roasting",
          "kite flying", "tide pools", "bicycle gears", "owls", "clay pottery", "rainbows", "the printing press"]
FACTS = {2: "Please remember this: my gym locker code is 4817.",
         3: "Also, my sister Ines lives in Lisbon and teaches violin."}
LOOK_UP_TURN = 40
LOOK_UP = "Do you remember my gym locker code?"


def metric(text: str, name: str) -> float:
    """The sum of a metric's samples (every label set) in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total
