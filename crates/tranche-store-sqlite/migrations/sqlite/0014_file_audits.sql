-- What each audit of an account's provider files counted: later audits compare against them to
-- tell how fast the files the provider limits grow, and so how many days are left to the limit.
CREATE TABLE file_audits (
    account               TEXT    NOT NULL,
    at                    INTEGER NOT NULL,
    total                 INTEGER NOT NULL,
    inputs_with_expiry    INTEGER NOT NULL,
    inputs_without_expiry INTEGER NOT NULL
) STRICT;

CREATE INDEX file_audits_by_account ON file_audits (account, at);
