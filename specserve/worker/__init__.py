"""The worker runtime for both roles: model thread, batching, sessions, servicer scaffolding, serve(role,
config). Named for what it runs, the draft and target workers their services wrap (DraftWorker,
TargetWorker), and kept short: the services import it on most lines that touch it."""
