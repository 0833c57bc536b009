"""The coordinator service the operator runs: HTTP routes (api), the rules (service),
the database (store, migrations), placement, metrics, the operator page (web) and the
process that serves them (serve). Never imported by code that runs on volunteer PCs."""
