-- Task ids that start with their creation time (RFC 9562 UUID version 7), where they
-- were random (version 4).
--
-- A random id lands anywhere in tasks_pkey, so a batch of 1,000 new tasks dirtied
-- (and, after each checkpoint, wrote whole to the WAL) up to 1,000 scattered leaf pages
-- of it; ids that grow with time land on the index's last few pages. On a 2-core
-- machine a 1,000-row INSERT took about 10% less time (8 to 15%; bench/README.md,
-- "enqueue", sixth pass), and completes of tasks enqueued together touch neighbouring pages.
--
-- An id is 48 bits of Unix time in milliseconds, the version, 74 random bits and the
-- variant: unique without coordination, and not to be guessed from another id. It has
-- the same type and text form as before; what a reader can see is its version digit
-- (7), that ids sort by the time they were made, and that an id tells the millisecond
-- it was made in. Ids made before this migration keep their value. The gateway writes
-- ids of the same form when it chooses them itself (store_tasks.new_task_ids).
--
-- Runs in one transaction; SET DEFAULT changes the catalog only (no rewrite, no scan),
-- but it waits for an exclusive lock on tasks, and every enqueue and claim would queue
-- behind that wait. If a long transaction holds the table for more than 5 s, the
-- migration fails instead (nothing applied) and can be run again.
SET LOCAL lock_timeout = '5s';

CREATE FUNCTION time_ordered_uuid() RETURNS uuid LANGUAGE sql VOLATILE PARALLEL SAFE
RETURN encode(
    -- Bits 52 and 53 turn gen_random_uuid()'s version 4 (0100) into 7 (0111).
    set_bit(set_bit(
        overlay(uuid_send(gen_random_uuid())
                PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
                                  FROM 3)
                FROM 1 FOR 6),
        52, 1), 53, 1),
    'hex')::uuid;

ALTER TABLE tasks ALTER COLUMN id SET DEFAULT time_ordered_uuid();
