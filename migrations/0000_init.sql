CREATE TABLE `blobs` (
	`sha256` text PRIMARY KEY NOT NULL,
	`size` integer NOT NULL,
	`data` blob NOT NULL
);
--> statement-breakpoint
CREATE TABLE `exchanges` (
	`id` integer PRIMARY KEY AUTOINCREMENT NOT NULL,
	`run_id` integer NOT NULL,
	`started_at` integer NOT NULL,
	`request_id` text,
	`method` text NOT NULL,
	`path` text NOT NULL,
	`endpoint` text,
	`outcome` text NOT NULL,
	`error` text,
	`status` integer,
	`model` text,
	`stream` integer,
	`total_ms` real,
	`token_source` text,
	`prompt_ids` blob,
	`prompt_len` integer,
	`prompt_key` text,
	`request_shape` text,
	`injected` text,
	`usage` text,
	`request_headers` text,
	`request_body` blob,
	`response_headers` text,
	`response_body` blob,
	`event_ends` blob,
	`event_times` blob,
	`event_tokens` blob,
	FOREIGN KEY (`run_id`) REFERENCES `runs`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE INDEX `exchanges_prompt_key` ON `exchanges` (`prompt_key`) WHERE outcome = 'complete';--> statement-breakpoint
CREATE INDEX `exchanges_model` ON `exchanges` (`model`);--> statement-breakpoint
CREATE TABLE `generations` (
	`exchange_id` integer NOT NULL,
	`choice_index` integer NOT NULL,
	`output_ids` blob NOT NULL,
	`token_times` blob NOT NULL,
	`chunk_tokens` blob NOT NULL,
	`chunk_deltas` text NOT NULL,
	`text` text NOT NULL,
	`finish_reason` text,
	`stop_reason` text,
	PRIMARY KEY(`exchange_id`, `choice_index`),
	FOREIGN KEY (`exchange_id`) REFERENCES `exchanges`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE TABLE `runs` (
	`id` integer PRIMARY KEY AUTOINCREMENT NOT NULL,
	`started_at` integer NOT NULL,
	`kind` text NOT NULL,
	`upstream` text,
	`label` text,
	`engine_version` text,
	`version_json` text,
	`models_json` text,
	`max_model_len` integer,
	`tokenizer_name` text,
	`tokenizer_files` text
);
