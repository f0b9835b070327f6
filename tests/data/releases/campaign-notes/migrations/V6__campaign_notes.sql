CREATE TABLE campaign_notes (
  campaign_id text PRIMARY KEY REFERENCES campaigns,
  note        text NOT NULL
);
