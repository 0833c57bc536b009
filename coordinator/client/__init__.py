"""What runs on volunteer PCs to talk to the coordinator: joining with an invite and the
authenticated session (session), and downloading a stage's pieces (downloads). Uses
requests only: no FastAPI, no database."""
