"""How a node reaches a peer (its address, then ICE, then the relay), and dials it again
when a link is lost.
"""
