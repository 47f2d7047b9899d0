-- The gate's read never scans the jobs table. Its counts are planned once per session (tenure_enqueue's
-- plan_cache_mode holds for the functions it calls), and a session that planned them while the table was small
-- kept a sequential scan of `jobs` for the total: every later submit of that session read every job the table
-- held, finished ones included (auto_explain of a submit: a Seq Scan removing 299 finished rows, 0.16 ms of the
-- read, growing with the table, where the partial index answers in microseconds; until an autoanalyze happened
-- to invalidate the plan). With sequential scans off for this function the counts walk the partial indexes of
-- waiting jobs whatever the statistics said when the plan was made (tests/integration/test_admission_round_trips.py).
ALTER FUNCTION tenure_admission_state(text, text, float8, int8) SET enable_seqscan = off;
