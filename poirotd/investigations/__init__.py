"""Investigations: the queue and its workers, what they record, and what opens them."""
