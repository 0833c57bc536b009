"""`python -m app.cli ARGS` is `sangama ARGS`: child processes and tests start it so."""

from app.cli.main import main

raise SystemExit(main())
