"""A stage's links onward: to the next stage, the ring back to the first, and which link
carries TOKENS home.
"""
