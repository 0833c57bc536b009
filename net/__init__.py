"""Wire format, sans-IO protocol state and transports. Imports neither `core` nor Qt."""
