-- A pause's reason and end (docs/design.md, "5.2 Runtime controls"). All three are
-- null unless `paused`. `paused_at` is the server's time of the pause; a pause whose
-- `paused_until` has passed counts as resumed wherever it is read (the row keeps
-- `paused` true until the next change: nothing has to run at that time).
ALTER TABLE runtime_controls
    ADD COLUMN paused_reason text CHECK (char_length(paused_reason) BETWEEN 1 AND 500),
    ADD COLUMN paused_at     timestamptz,
    ADD COLUMN paused_until  timestamptz;
