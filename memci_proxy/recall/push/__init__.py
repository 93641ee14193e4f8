"""Recall the model did not ask for: what a user message needs from the archive (salience), the pushed round's shape
(proactive), and the B5 memory block of the turn (memory_block)."""
