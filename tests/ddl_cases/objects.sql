-- What a schema holds besides tables, written unqualified: an aggregate, an operator, an operator class in its own
-- family, a collation, a text search configuration, a cast of the file's own type, a rule, statistics.
CREATE FUNCTION join_line(acc text, line text) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT coalesce(acc || ',', '') || line $$;
CREATE AGGREGATE join_lines(text) (SFUNC = join_line, STYPE = text);
CREATE FUNCTION same_word(a text, b text) RETURNS boolean LANGUAGE sql IMMUTABLE STRICT AS $$ SELECT lower(a) = lower(b) $$;
CREATE OPERATOR ~= (LEFTARG = text, RIGHTARG = text, FUNCTION = same_word);
CREATE FUNCTION desc_cmp(a integer, b integer) RETURNS integer LANGUAGE sql IMMUTABLE STRICT AS $$ SELECT btint4cmp(b, a) $$;
CREATE OPERATOR FAMILY desc_ops USING btree;
CREATE OPERATOR CLASS desc_int_ops FOR TYPE integer USING btree FAMILY desc_ops AS
  OPERATOR 1 >, OPERATOR 2 >=, OPERATOR 3 =, OPERATOR 4 <=, OPERATOR 5 <, FUNCTION 1 desc_cmp(integer, integer);
CREATE COLLATION bytewise (provider = libc, locale = 'C');
CREATE TEXT SEARCH DICTIONARY plain_words (TEMPLATE = simple);
CREATE TEXT SEARCH CONFIGURATION plain (COPY = simple);
ALTER TEXT SEARCH CONFIGURATION plain ALTER MAPPING FOR asciiword WITH plain_words;
CREATE TYPE price AS (amount numeric, currency text);
CREATE FUNCTION price_text(price) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT $1.amount || ' ' || $1.currency $$;
CREATE CAST (price AS text) WITH FUNCTION price_text(price);
CREATE TABLE items (id bigint PRIMARY KEY DEFAULT next_id(), rank integer, name text COLLATE bytewise, cost price);
CREATE INDEX items_rank ON items (rank desc_int_ops);
CREATE RULE items_keep AS ON DELETE TO items DO INSTEAD NOTHING;
CREATE STATISTICS items_stats (dependencies) ON rank, name FROM items;
COMMENT ON AGGREGATE join_lines(text) IS 'lines joined';
-- check: SELECT {shard}.join_lines(x) FROM (VALUES ('a'), ('b')) v(x) => a,b
-- check: SELECT 'A' OPERATOR({shard}.~=) 'a' => True
-- check: SELECT f.opfname || '@' || f.opfnamespace::regnamespace::text FROM pg_opclass c JOIN pg_opfamily f ON f.oid = c.opcfamily WHERE c.opcname = 'desc_int_ops' AND c.opcnamespace = '{shard}'::regnamespace => desc_ops@{shard}
-- check: SELECT pg_get_indexdef('{shard}.items_rank'::regclass) => CREATE INDEX items_rank ON {shard}.items USING btree (rank {shard}.desc_int_ops)
-- check: SELECT to_tsvector('{shard}.plain', 'The Word') => 'the':1 'word':2
-- check: SELECT CAST(ROW(2, 'EUR')::{shard}.price AS text) => 2 EUR
-- check: SELECT count(*) FROM pg_rewrite WHERE ev_class = '{shard}.items'::regclass AND rulename = 'items_keep' => 1
-- check: SELECT stxnamespace::regnamespace::text FROM pg_statistic_ext WHERE stxname = 'items_stats' AND stxnamespace = '{shard}'::regnamespace => {shard}
-- check: SELECT obj_description('{shard}.join_lines(text)'::regprocedure, 'pg_proc') => lines joined

-- A cast between types outside the shards would be made once per shard.
CREATE CAST (text AS money) WITH INOUT;
-- error: statement 1 (CREATE CAST) cannot be sharded: it creates a cast between types that are not the shard's: it would be created once per shard ({file}:34:1): a cast between types outside the shards belongs to the database: create it once per database outside pgidgen
