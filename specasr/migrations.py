"""The run store's schema: an ordered list of migrations, a store's version being the number of them applied.

A migration is a list of SQL statements. A store opened by an older specasr is brought up to date in one transaction;
the store module decides what to do with files this one cannot read.
"""

import duckdb

APPLICATION = "specasr"

# `runtime` became the centre that moves on with depth (what runtime-paced was); the one that stays is runtime-last.
# Runs stored (or exported) before keep what they measured under the new names, renamed in this order.
RENAMED_WINDOWS = (("runtime", "runtime-last"), ("runtime-paced", "runtime"))
# Runs stored (or exported) before draft trees drafted chains: a chain's nodes are its proposals in order.
CHAIN_NODES = [
    "UPDATE runs SET tree_nodes = k WHERE draft IS NOT NULL AND tree_nodes IS NULL",
    "UPDATE rounds SET drafted = len(proposed) WHERE drafted IS NULL",
    "UPDATE draft_steps SET node = depth - 1, parent = CASE WHEN depth > 1 THEN depth - 2 END WHERE node IS NULL",
]
MIGRATIONS: list[list[str]] = [
    [
        "CREATE TABLE schema_version (application VARCHAR NOT NULL, version INTEGER NOT NULL)",
        """CREATE TABLE runs (
            run_id VARCHAR PRIMARY KEY,
            created TIMESTAMP NOT NULL,  -- UTC
            command VARCHAR NOT NULL,
            target VARCHAR NOT NULL,
            device VARCHAR NOT NULL,
            dtype VARCHAR NOT NULL,
            draft VARCHAR,
            draft_dtype VARCHAR,
            k INTEGER NOT NULL,
            "window" VARCHAR NOT NULL,
            half_width_ms DOUBLE NOT NULL,
            runtime_layer INTEGER,
            threshold DOUBLE NOT NULL,
            aligner VARCHAR NOT NULL,
            reference VARCHAR NOT NULL,
            verify_peaks BOOLEAN NOT NULL,
            keep_attention BOOLEAN NOT NULL,
            max_seconds DOUBLE NOT NULL,
            package_version VARCHAR NOT NULL,
            git_commit VARCHAR,
            git_dirty BOOLEAN
        )""",
        """CREATE TABLE clips (
            clip_hash VARCHAR PRIMARY KEY,
            clip_id VARCHAR NOT NULL,
            clip_seconds DOUBLE NOT NULL,
            dataset VARCHAR NOT NULL,
            reference_text VARCHAR NOT NULL
        )""",
        """CREATE TABLE decodes (
            run_id VARCHAR NOT NULL,
            decode INTEGER NOT NULL,  -- index within the run
            repeat INTEGER NOT NULL,
            clip_hash VARCHAR NOT NULL,
            clip_id VARCHAR NOT NULL,
            text VARCHAR NOT NULL,
            tokens INTEGER[] NOT NULL,
            draft_name VARCHAR NOT NULL,
            draft_hash VARCHAR,
            reference_frames INTEGER[],
            reference_source VARCHAR,
            features_seconds DOUBLE NOT NULL,
            encoder_seconds DOUBLE NOT NULL,
            decode_seconds DOUBLE NOT NULL,
            reference_seconds DOUBLE NOT NULL,
            wer DOUBLE,  -- against the clip's reference text, where it has words
            PRIMARY KEY (run_id, decode)
        )""",
        # The per-decode levels carry no key index: their rows are unique by construction and indexes slow writes.
        """CREATE TABLE rounds (
            run_id VARCHAR NOT NULL,
            decode INTEGER NOT NULL,
            index INTEGER NOT NULL,
            segment INTEGER NOT NULL,
            start INTEGER NOT NULL,
            proposed INTEGER[] NOT NULL,
            accepted INTEGER NOT NULL,
            target_token INTEGER NOT NULL,
            draft_seconds DOUBLE NOT NULL,
            verify_seconds DOUBLE NOT NULL
        )""",
        """CREATE TABLE draft_steps (
            run_id VARCHAR NOT NULL,
            decode INTEGER NOT NULL,
            round INTEGER NOT NULL,
            depth INTEGER NOT NULL,
            token INTEGER NOT NULL,
            accepted BOOLEAN NOT NULL,
            draft_peak INTEGER,
            window_centre INTEGER,
            reference_frame INTEGER,
            attention FLOAT[]
        )""",
        """CREATE TABLE verified_tokens (
            run_id VARCHAR NOT NULL,
            decode INTEGER NOT NULL,
            position INTEGER NOT NULL,
            token INTEGER NOT NULL,
            verify_peaks INTEGER[] NOT NULL
        )""",
    ],
    [
        """CREATE TABLE segments (
            run_id VARCHAR NOT NULL,
            decode INTEGER NOT NULL,
            index INTEGER NOT NULL,
            start_frame INTEGER NOT NULL,
            valid_frames INTEGER NOT NULL,
            first_token INTEGER NOT NULL,
            tokens INTEGER NOT NULL
        )""",
        """CREATE TABLE reference_frames (
            clip_hash VARCHAR NOT NULL,
            target VARCHAR NOT NULL,
            device VARCHAR NOT NULL,
            dtype VARCHAR NOT NULL,
            aligner VARCHAR NOT NULL,
            source VARCHAR NOT NULL,
            window_tokens INTEGER[][] NOT NULL,
            frames INTEGER[] NOT NULL,
            words VARCHAR NOT NULL,  -- JSON list of WordTime
            created TIMESTAMP NOT NULL,  -- UTC
            PRIMARY KEY (clip_hash, target, device, dtype, aligner)
        )""",
    ],
    ["""ALTER TABLE runs ADD COLUMN decoder VARCHAR DEFAULT 'specasr'"""],
    ["""ALTER TABLE decodes ADD COLUMN frame_seconds DOUBLE DEFAULT 0.02"""],  # stores before it held Whisper only
    ["""ALTER TABLE runs ADD COLUMN batch VARCHAR"""],  # NULL for runs written before batches were kept
    ["""ALTER TABLE runs ADD COLUMN assistant VARCHAR"""],  # the transformers-assisted peer's assistant
    [  # whether our loops replayed captured steps; before, only CUDA's speculative rounds did
        """ALTER TABLE runs ADD COLUMN graphs BOOLEAN DEFAULT false""",
        """UPDATE runs SET graphs = device LIKE 'cuda%' AND draft IS NOT NULL AND decoder = 'specasr'""",
    ],
    [
        *(f"""UPDATE runs SET "window" = '{new}' WHERE "window" = '{old}'""" for old, new in RENAMED_WINDOWS),
        """ALTER TABLE decodes ADD COLUMN runtime_peaks INTEGER[]""",  # NULL for runs stored before it was kept
    ],
    [  # a trace that renders without its model: token texts, the runtime layer, the clip's audio; runs get names
        """ALTER TABLE decodes ADD COLUMN token_texts VARCHAR[]""",
        """ALTER TABLE decodes ADD COLUMN target_runtime_layer INTEGER""",
        """ALTER TABLE draft_steps ADD COLUMN text VARCHAR""",
        """ALTER TABLE clips ADD COLUMN audio_path VARCHAR DEFAULT ''""",
        """ALTER TABLE runs ADD COLUMN name VARCHAR DEFAULT ''""",
        """ALTER TABLE runs ADD COLUMN note VARCHAR DEFAULT ''""",
        """CREATE TABLE clip_audio (
            clip_hash VARCHAR PRIMARY KEY,
            flac BLOB NOT NULL  -- the waveform as FLAC, 24-bit, 16 kHz mono
        )""",
    ],
    [  # draft trees: a run's tree shape; a draft step is a node of its round's tree, with its parent and probability
        """ALTER TABLE runs ADD COLUMN tree_width INTEGER DEFAULT 1""",
        """ALTER TABLE runs ADD COLUMN tree_nodes INTEGER""",
        """ALTER TABLE draft_steps ADD COLUMN node INTEGER""",
        """ALTER TABLE draft_steps ADD COLUMN parent INTEGER""",
        """ALTER TABLE draft_steps ADD COLUMN probability DOUBLE""",  # NULL for runs stored before trees
        """ALTER TABLE rounds ADD COLUMN drafted INTEGER""",
        *CHAIN_NODES,
    ],
    ["""ALTER TABLE runs ADD COLUMN compile BOOLEAN DEFAULT false"""],  # whether torch.compile compiled the steps
    [  # grids stored clip by clip: how many clips a run's batch holds when complete (NULL: it was written whole);
        # matched rounds' rollouts, kept per clip and condition so that an interrupted command resumes
        """ALTER TABLE runs ADD COLUMN batch_clips INTEGER""",
        """CREATE TABLE rollouts (
            clip_hash VARCHAR NOT NULL,
            condition VARCHAR NOT NULL,  -- what was rolled out: settings and round starts, as JSON
            arrays BLOB NOT NULL,  -- the clip's rollouts under it, as .npz
            created TIMESTAMP NOT NULL,  -- UTC
            PRIMARY KEY (clip_hash, condition)
        )""",
    ],
]
SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(con: duckdb.DuckDBPyConnection) -> int | None:
    """The database's schema version: 0 for one without tables, None for one with tables of another program."""
    tables = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if not tables:
        return 0
    if "schema_version" in tables:
        rows = con.execute("SELECT application, version FROM schema_version").fetchall()
        if len(rows) == 1 and rows[0][0] == APPLICATION:
            return rows[0][1]
    return None


def migrate(con: duckdb.DuckDBPyConnection, version: int, target: int = SCHEMA_VERSION) -> None:
    """Apply the migrations from `version` up to `target`; the caller owns the transaction."""
    for statement in (s for migration in MIGRATIONS[version:target] for s in migration):
        con.execute(statement)
    con.execute("DELETE FROM schema_version")
    con.execute("INSERT INTO schema_version VALUES (?, ?)", [APPLICATION, target])
