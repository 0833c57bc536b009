"""Finding a path between two nodes behind home routers: ICE (the only aioice user), its values, and TURN relays."""
