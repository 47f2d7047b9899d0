"""The dashboard served by the gateway at `/ui`: pages (routes.py), sessions (sessions.py), live labs (labs.py)."""
