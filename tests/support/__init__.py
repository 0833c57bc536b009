"""Test helpers and fakes, in one place."""
