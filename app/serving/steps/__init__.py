"""A stage's engine steps, run on its engine thread: plain decodes, replays, verified
guesses, the MTP head, and the replies built from them.
"""
