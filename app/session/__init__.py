"""The session protocol client and stages share: replays' shapes and resume fields,
guesses, wire values.
"""
