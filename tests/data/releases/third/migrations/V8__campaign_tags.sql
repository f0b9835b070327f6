CREATE TABLE campaign_tags (campaign_id text NOT NULL REFERENCES campaigns, tag text NOT NULL);
