"""A stage's rules without IO: sessions, resumes, peers and per-node limits, heartbeats;
events in, decisions out.
"""
