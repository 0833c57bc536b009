"""The swarm's coordinator, both ends of its HTTP API.

`server/` is the operator's service (FastAPI, SQLAlchemy, Alembic): invites, CA,
registry, placement, pieces, the operator page. `client/` is what runs on volunteer PCs
to talk to it (requests only). Both build what crosses HTTP from `contract`; `errors`
and `invites` (the invite code format and its pure rules) are shared too.
"""
