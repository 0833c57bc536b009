"""QUIC links: the only users of the QUIC libraries (qh3, aioquic), their sockets and timers."""
