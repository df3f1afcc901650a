"""Fleets: replicas behind a router, live (launched replicas and sglang-router, scraped per replica)
and on the twin (replica twins behind a router policy)."""
