-- error: statement 1 (CREATE SCHEMA) cannot be sharded: it creates a schema ({file}:2:1): shards are schemas pgidgen manages; write tables unqualified and pgidgen puts them into every shard
CREATE SCHEMA app;

-- error: statement 2 (INSERT) cannot be sharded: it is INSERT, not DDL ({file}:6:3): sharded files hold schema only: write data through your application
CREATE TABLE a (id bigint DEFAULT next_id());
  INSERT INTO a VALUES (1);

-- error: statement 1 (SELECT) cannot be sharded: it is SELECT, not DDL ({file}:9:1): sharded files hold schema only: write data through your application
SELECT 1;

-- error: syntax error at or near "TABL" ({file}:13:8): fix the SQL; nothing was applied
CREATE TABLE a (id bigint);
CREATE TABL b (id bigint);

-- error: statement 1 (DROP SCHEMA) cannot be sharded: it names a schema ({file}:16:1): shards are schemas pgidgen manages; write tables unqualified and pgidgen puts them into every shard
DROP SCHEMA shard_3 CASCADE;

-- error: statement 1 (ALTER TABLE) cannot be sharded: it names relation shards in pgidgen's catalog schema ({file}:19:1): the catalog is pgidgen's own; leave it out of sharded files
ALTER TABLE pgidgen.shards ADD COLUMN x int;

-- error: statement 2 (CREATE TABLE) cannot be sharded: it names relation photos in shard schema shard_7 ({file}:23:1): write names unqualified (and next_id() without a schema): pgidgen puts them into every shard itself
CREATE TABLE a (id bigint);
CREATE TABLE b (id bigint REFERENCES shard_7.photos (id));

-- error: statement 1 (CREATE TABLE) cannot be sharded: it names function next_id() in shard schema shard_1 ({file}:26:1): write names unqualified (and next_id() without a schema): pgidgen puts them into every shard itself
CREATE TABLE a (id bigint DEFAULT shard_1.next_id());

-- error: statement 1 (CREATE INDEX) cannot be sharded: CREATE INDEX CONCURRENTLY needs an index name ({file}:29:1): name the index (CREATE INDEX CONCURRENTLY t_v_idx ON t (v)): a re-run finds an invalid one left by a failed build by its name
CREATE INDEX CONCURRENTLY ON photos (user_id);

-- error: statement 1 (CREATE TABLE) cannot be sharded: it would change public.countries once per shard ({file}:32:1): a sharded file creates and changes objects inside the shards only; objects qualified with a schema may be referenced, not created or changed: manage them outside pgidgen
CREATE TABLE public.countries (code text PRIMARY KEY);

-- error: statement 1 (CREATE FUNCTION) cannot be sharded: the function sets its own search_path ({file}:35:1): remove the SET search_path: pgidgen pins every shard function to its shard, pg_catalog, pg_temp
CREATE FUNCTION f() RETURNS int LANGUAGE sql SET search_path = public AS 'SELECT 1';

-- error: statement 1 (BEGIN) cannot be sharded: it controls the transaction ({file}:38:1): remove it: pgidgen runs each database in one transaction of its own
BEGIN;

-- error: statement 1 (CREATE EXTENSION) cannot be sharded: pgidgen does not shard this kind of statement ({file}:41:1): run it outside pgidgen, once per database if it must be everywhere
CREATE EXTENSION pg_trgm;

-- error: statement 1 (CREATE TABLE) cannot be sharded: it creates a temporary table ({file}:44:1): temporary tables are per session, not per shard: leave them out of sharded files
CREATE TEMP TABLE scratch (x int);

-- error: statement 1 (CREATE FUNCTION) cannot be sharded: its body names another shard's schema ({file}:47:1): write names unqualified: the function's search_path is its own shard
CREATE FUNCTION f() RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN RETURN (SELECT count(*) FROM shard_2.photos); END $$;

-- error: statement 1 (CREATE TABLE) cannot be sharded: it would change public.base once per shard ({file}:50:1): a sharded file creates and changes objects inside the shards only; objects qualified with a schema may be referenced, not created or changed: manage them outside pgidgen
CREATE TABLE kids (b int) INHERITS (public.base);

-- error: statement 1 (ALTER TABLE) cannot be sharded: it would change public.p once per shard ({file}:53:1): a sharded file creates and changes objects inside the shards only; objects qualified with a schema may be referenced, not created or changed: manage them outside pgidgen
ALTER TABLE t ATTACH PARTITION public.p FOR VALUES IN (1);

-- error: statement 1 (CREATE TABLE) cannot be sharded: it names relation s (in a string) in shard schema shard_3 ({file}:56:1): write names unqualified (and next_id() without a schema): pgidgen puts them into every shard itself
CREATE TABLE counters (n bigint DEFAULT nextval('shard_3.s'));

-- A failure on the server names the shard, statement and line; nothing is applied anywhere.
-- error: 3 of 3 databases failed (db1, db2, db3)
CREATE TABLE a (id bigint);
CREATE TABLE b (id bigint REFERENCES nosuch (id));
-- output: db1: failed, rolled back: database db1 failed in shard_0 at statement 2 (CREATE TABLE) of {file}:61:1: relation "shard_0.nosuch" does not exist [SQLSTATE 42P01]: nothing was applied anywhere (rolled back); fix the file, or the shards it does not fit

-- error: statement 2 (CREATE TABLE) cannot be sharded: nextval() takes its sequence's name as text, looked up on every call through the caller's search_path, not in the shard ({file}:66:1): write nextval('name') with the name as a plain string (or ::regclass): each shard then uses its own sequence
CREATE SEQUENCE s;
CREATE TABLE counters (n bigint DEFAULT nextval('s'::text));

-- error: statement 1 (CREATE TABLE) cannot be sharded: nextval() takes its sequence's name as text, looked up on every call through the caller's search_path, not in the shard ({file}:69:1): write nextval('name') with the name as a plain string (or ::regclass): each shard then uses its own sequence
CREATE TABLE counters (n bigint DEFAULT nextval('s'::text::regclass));

-- error: statement 1 (REINDEX) cannot be sharded: REINDEX without CONCURRENTLY locks the table's writes for the whole rebuild ({file}:72:1): write REINDEX INDEX CONCURRENTLY name (or REINDEX TABLE CONCURRENTLY name): pgidgen runs it shard by shard
REINDEX TABLE photos;

-- error: statement 1 (REINDEX) cannot be sharded: pgidgen reindexes one index or one table at a time ({file}:75:1): write REINDEX INDEX CONCURRENTLY name or REINDEX TABLE CONCURRENTLY name
REINDEX SCHEMA CONCURRENTLY shard_1;
