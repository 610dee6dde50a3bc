"""Results: takes finished (or partial) runs, and gives the result JSON and its schema, the parity check, the
comparison of several runs (`compare`, `report`) as tables, markdown, CSV, JSON and plots."""
