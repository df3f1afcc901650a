"""Calibration: fit a server profile's step-time coefficients to measurements of a designed sweep.

`sweep` designs the sweep; `on_server` measures it on a live server and `on_twin` on the twin; `usable`
keeps the points measured; `fit` fits the coefficients with the twin as the model; `drift` says how
steady the server was over the rounds; `report` writes the texts; `pipeline` runs it all, for
`agentload calibrate` and for a study's calibration of its twin.
"""
