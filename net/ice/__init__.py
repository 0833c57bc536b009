"""Finding a path between nodes behind home routers: ICE (the only aioice user), TURN relays."""
