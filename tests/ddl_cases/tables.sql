-- The issue's file: tables with next_id(), REFERENCES between sharded tables, an unnamed index.
CREATE TABLE photos (
  id         bigint PRIMARY KEY DEFAULT next_id(),
  user_id    bigint NOT NULL,
  caption    text,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON photos (user_id, id);
CREATE TABLE likes (
  id       bigint PRIMARY KEY DEFAULT next_id(),
  photo_id bigint NOT NULL REFERENCES photos (id) ON DELETE CASCADE,
  user_id  bigint NOT NULL
);
-- check: SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef WHERE adrelid = '{shard}.photos'::regclass AND adnum = 1 => {shard}.next_id()
-- check: SELECT indexdef FROM pg_indexes WHERE schemaname = '{shard}' AND tablename = 'photos' ORDER BY 1 => CREATE INDEX photos_user_id_id_idx ON {shard}.photos USING btree (user_id, id), CREATE UNIQUE INDEX photos_pkey ON {shard}.photos USING btree (id)
-- check: SELECT confrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = '{shard}.likes'::regclass AND contype = 'f' => {shard}.photos|FOREIGN KEY (photo_id) REFERENCES {shard}.photos(id) ON DELETE CASCADE
-- check: INSERT INTO {shard}.photos (user_id) VALUES (1) RETURNING pgidgen.shard_of(id) = {n} => True

-- Constraints of every kind, a named index, a partial index.
CREATE TABLE users (
  id       bigint DEFAULT next_id(),
  email    text NOT NULL,
  age      int CHECK (age >= 0),
  CONSTRAINT users_pk PRIMARY KEY (id),
  CONSTRAINT users_email_key UNIQUE (email)
);
CREATE INDEX users_young ON users (age) WHERE age < 30;
-- check: SELECT conname || ':' || contype::text FROM pg_constraint WHERE conrelid = '{shard}.users'::regclass AND contype <> 'n' ORDER BY 1 => users_age_check:c, users_email_key:u, users_pk:p
-- check: SELECT indexdef FROM pg_indexes WHERE schemaname = '{shard}' AND indexname = 'users_young' => CREATE INDEX users_young ON {shard}.users USING btree (age) WHERE (age < 30)

-- References to a user-qualified table stay as written.
-- setup: CREATE TABLE public.countries (code text PRIMARY KEY)
CREATE TABLE addresses (
  id      bigint PRIMARY KEY DEFAULT next_id(),
  country text REFERENCES public.countries (code)
);
-- check: SELECT confrelid::regclass::text FROM pg_constraint WHERE conrelid = '{shard}.addresses'::regclass AND contype = 'f' => countries

-- Partitioned tables and their partitions.
CREATE TABLE events (
  id bigint NOT NULL DEFAULT next_id(),
  at timestamptz NOT NULL,
  PRIMARY KEY (id, at)
) PARTITION BY RANGE (at);
CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
CREATE TABLE events_rest (LIKE events INCLUDING DEFAULTS);
ALTER TABLE events ATTACH PARTITION events_rest DEFAULT;
-- check: SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = '{shard}.events'::regclass ORDER BY 1 => events_2026, events_rest
-- check: SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef WHERE adrelid = '{shard}.events_rest'::regclass => {shard}.next_id()

-- ALTER TABLE: add, alter and drop columns; add and drop constraints.
CREATE TABLE posts (id bigint PRIMARY KEY DEFAULT next_id(), body text, draft boolean);
ALTER TABLE posts ADD COLUMN title text NOT NULL DEFAULT '';
ALTER TABLE posts ALTER COLUMN body SET NOT NULL, DROP COLUMN draft;
ALTER TABLE posts ADD CONSTRAINT posts_title_len CHECK (length(title) < 200);
ALTER TABLE posts RENAME COLUMN body TO content;
ALTER TABLE posts ADD COLUMN parent bigint REFERENCES posts (id);
-- check: SELECT string_agg(attname || ':' || attnotnull, ',' ORDER BY attnum) FROM pg_attribute WHERE attrelid = '{shard}.posts'::regclass AND attnum > 0 AND NOT attisdropped => id:true,content:true,title:true,parent:false
-- check: SELECT count(*) FROM pg_constraint WHERE conrelid = '{shard}.posts'::regclass AND conname = 'posts_title_len' => 1

-- Sequences, enum types and COMMENT ON.
CREATE TYPE mood AS ENUM ('happy', 'sad');
CREATE SEQUENCE ticket_no;
CREATE TABLE tickets (id bigint PRIMARY KEY DEFAULT next_id(), no bigint DEFAULT nextval('ticket_no'), m mood);
COMMENT ON TABLE tickets IS 'support tickets';
COMMENT ON COLUMN tickets.no IS 'human-friendly number';
-- check: SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = '{shard}.tickets'::regclass AND attname = 'm' => {shard}.mood
-- check: SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef WHERE adrelid = '{shard}.tickets'::regclass AND adnum = 2 => nextval('{shard}.ticket_no'::regclass)
-- check: SELECT obj_description('{shard}.tickets'::regclass, 'pg_class') || '/' || col_description('{shard}.tickets'::regclass, 2) => support tickets/human-friendly number

-- Domains, range and composite types, a policy, a materialized view, grants.
-- setup: DO $$ BEGIN CREATE ROLE app_reader; EXCEPTION WHEN duplicate_object THEN NULL; END $$
CREATE DOMAIN positive AS int CHECK (VALUE > 0);
CREATE TYPE span AS RANGE (subtype = int4);
CREATE TYPE pair AS (a positive, b span);
CREATE TABLE stock (id bigint PRIMARY KEY DEFAULT next_id(), owner bigint, qty positive, p pair);
ALTER TABLE stock ENABLE ROW LEVEL SECURITY;
CREATE POLICY own ON stock USING (owner = 1);
CREATE MATERIALIZED VIEW stock_by_owner AS SELECT owner, sum(qty) AS qty FROM stock GROUP BY owner;
GRANT SELECT ON stock, stock_by_owner TO app_reader;
REVOKE ALL ON stock FROM PUBLIC;
-- check: SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = '{shard}.stock'::regclass AND attnum > 2 ORDER BY attnum => {shard}.positive, {shard}.pair
-- check: SELECT polname FROM pg_policy WHERE polrelid = '{shard}.stock'::regclass => own
-- check: SELECT relkind::text FROM pg_class WHERE oid = '{shard}.stock_by_owner'::regclass => m
-- check: SELECT has_table_privilege('app_reader', '{shard}.stock', 'SELECT') => True
