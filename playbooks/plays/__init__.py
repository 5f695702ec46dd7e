"""The plays: each module makes the steps of one part of the tutorial (or of
one task: status, doctor, logs). Support modules are one folder up."""
