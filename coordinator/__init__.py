"""The swarm's coordinator service: invites, CA, registry, placement, pieces, web page."""
