"""Composition root: CLI, worker, client; Qt lives only in app/ui and app/controllers."""
