-- Keeps the rows the engine scans and updates small: request bodies and outputs move to tables
-- of their own (written once, read when a tranche's file is written or results are read), and
-- jobs know their tranches through a link table instead of a scan of their requests.

CREATE TABLE request_bodies (
    request_id INTEGER PRIMARY KEY REFERENCES requests (id),
    body       TEXT NOT NULL
) STRICT;

INSERT INTO request_bodies (request_id, body) SELECT id, body FROM requests;
ALTER TABLE requests DROP COLUMN body;

-- Outputs are appended in the order results arrive (shuffled against request order), so each
-- lands on the table's last page; only the small index on request_id is written at random.
CREATE TABLE request_outputs (
    id         INTEGER PRIMARY KEY,
    request_id INTEGER NOT NULL UNIQUE REFERENCES requests (id),
    output     TEXT NOT NULL
) STRICT;

INSERT INTO request_outputs (request_id, output)
    SELECT id, output FROM requests WHERE output IS NOT NULL ORDER BY id;
ALTER TABLE requests DROP COLUMN output;

-- Every tranche that held a request of a job (a job waits for them to end; status counts them).
CREATE TABLE job_tranches (
    job_id     TEXT NOT NULL REFERENCES jobs (id),
    tranche_id TEXT NOT NULL REFERENCES tranches (id),
    PRIMARY KEY (job_id, tranche_id)
) STRICT, WITHOUT ROWID;

CREATE INDEX job_tranches_by_tranche ON job_tranches (tranche_id);

INSERT OR IGNORE INTO job_tranches (job_id, tranche_id)
    SELECT DISTINCT job_id, tranche_id FROM requests WHERE tranche_id IS NOT NULL;
INSERT OR IGNORE INTO job_tranches (job_id, tranche_id)
    SELECT DISTINCT r.job_id, a.tranche_id FROM attempts AS a JOIN requests AS r ON r.id = a.request_id;
