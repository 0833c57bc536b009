"""A WAN in userspace for labs, benchmarks and tests: UDP forwarders that delay, jitter and drop
datagrams. Nothing a volunteer runs imports it."""
