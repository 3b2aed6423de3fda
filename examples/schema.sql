-- The example app's tables (examples/photos.py), written once, unqualified: they are created in every shard
-- schema by `pgidgen apply-ddl examples/schema.sql` (or `python examples/photos.py setup`, which calls it), which
-- qualifies them per shard: in shard_5, id defaults to shard_5.next_id().
-- Rows are sharded by the photo owner's user_id (shard = user_id % shard count); a like lives with the
-- photo it likes, so "who liked this photo" is one query on one shard.

CREATE TABLE photos (
    id         bigint      PRIMARY KEY DEFAULT next_id(),
    user_id    bigint      NOT NULL,
    caption    text        NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX photos_user_id_id ON photos (user_id, id DESC);

CREATE TABLE likes (
    photo_id   bigint      NOT NULL REFERENCES photos (id) ON DELETE CASCADE,
    user_id    bigint      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (photo_id, user_id)
);
