ALTER TABLE campaign_notes ADD COLUMN seen_at timestamptz;
