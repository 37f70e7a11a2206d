use std::path::{Path, PathBuf};

use super::*;

pub(crate) fn tiny_model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-model")
}

#[test]
fn card_from_tiny_model_dir() {
    let card = ModelDeploymentCard::load_from_disk(&tiny_model_dir(), Some("tiny")).expect("load");
    assert_eq!(card.name(), "tiny");
    assert_eq!(card.slug, "tiny");
    assert_eq!(card.context_length, 8192);
    assert_eq!(card.architectural_max_context_length, 8192);
    assert!(matches!(
        card.tokenizer,
        Some(TokenizerKind::HfTokenizerJson(_))
    ));
    assert!(matches!(
        card.prompt_formatter,
        Some(PromptFormatterArtifact::HfTokenizerConfigJson(_))
    ));
    assert!(matches!(
        card.gen_config,
        Some(GenerationConfig::HfGenerationConfigJson(_))
    ));
    let Some(ModelInfo::HfConfigJson(f)) = &card.model_info else {
        panic!("config.json missing")
    };
    assert!(f.checksum.starts_with("blake3:") && f.checksum.len() == 7 + 64);
    assert!(f.path.is_absolute());
    f.read_verified().expect("unchanged");
    assert!(card.local_dir().ends_with("tiny-model"));
}

#[test]
fn card_json_round_trip() {
    let mut card = ModelDeploymentCard::load_from_disk(&tiny_model_dir(), None).expect("load");
    card.model_type = ModelType::CHAT | ModelType::COMPLETIONS;
    card.runtime_config.total_kv_blocks = Some(100);
    card.user_data = Some(serde_json::json!({"a": 1}));
    let json = card.to_json_str().expect("json");
    let back = ModelDeploymentCard::from_json_str(&json).expect("parse");
    assert_eq!(back, card);
    assert_eq!(back.mdcsum(), card.mdcsum());
    assert!(
        json.contains(r#""model_type":"chat,completions""#),
        "{json}"
    );
    assert!(ModelDeploymentCard::from_json_str("{not json").is_err());
    assert!(
        ModelDeploymentCard::from_json_str("{}").is_err(),
        "display_name is required"
    );
}

#[test]
fn missing_model_dir_names_the_path() {
    let err = ModelDeploymentCard::load_from_disk(Path::new("/definitely/not/here"), None)
        .expect_err("missing");
    assert!(err.to_string().contains("/definitely/not/here"), "{err}");
    let empty = std::env::temp_dir().join(format!("dynamo-empty-model-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("mkdir");
    let err = ModelDeploymentCard::load_from_disk(&empty, None).expect_err("no files");
    assert!(err.to_string().contains("config.json"), "{err}");
}

#[test]
fn checked_file_detects_changes() {
    let dir = std::env::temp_dir().join(format!("dynamo-checked-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let p = dir.join("f.json");
    std::fs::write(&p, "{}").expect("write");
    let f = CheckedFile::from_path(&p).expect("checksum");
    assert_eq!(f.size, 2);
    std::fs::write(&p, "{ }").expect("write");
    assert!(
        f.read_verified()
            .expect_err("changed")
            .to_string()
            .contains("checksum mismatch")
    );
}

#[test]
fn lora_ids_match_the_reference() {
    // Values observed from the reference implementation.
    for (name, id) in [
        ("", 1_979_294_118),
        ("a", 1_500_095_571),
        ("my-lora", 868_637_996),
        ("lora1", 1_129_801_875),
        ("hello world", 654_969_992),
    ] {
        assert_eq!(lora_name_to_id(name), id, "{name:?}");
    }
}

fn args(model_type: ModelType) -> RegisterModelArgs {
    RegisterModelArgs {
        model_input: ModelInput::Tokens,
        model_type,
        model_path: tiny_model_dir().display().to_string(),
        ..Default::default()
    }
}

#[test]
fn register_defaults() {
    let card = args(ModelType::CHAT).build_card().expect("card");
    assert_eq!(card.worker_type, WorkerType::Aggregated);
    assert_eq!(card.kv_cache_block_size, DEFAULT_KV_CACHE_BLOCK_SIZE);
    assert_eq!(card.name(), tiny_model_dir().display().to_string());
    assert!(card.needs.is_empty());
    let mut a = args(ModelType::CHAT);
    a.model_name = Some("Org/Tiny Model".into());
    a.context_length = Some(1024);
    a.kv_cache_block_size = Some(64);
    let card = a.build_card().expect("card");
    assert_eq!(
        (card.name(), card.slug.as_str()),
        ("Org/Tiny Model", "org_tiny_model")
    );
    assert_eq!(
        (card.context_length, card.architectural_max_context_length),
        (1024, 8192)
    );
    assert_eq!(card.kv_cache_block_size, 64);
}

#[test]
fn register_validation_rules() {
    let check = |mutate: fn(&mut RegisterModelArgs), needle: &str| {
        let mut a = args(ModelType::CHAT);
        mutate(&mut a);
        let err = a.build_card().expect_err(needle);
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    };
    check(
        |a| {
            a.worker_type = Some(WorkerType::Prefill);
            a.model_type = ModelType::EMPTY;
            a.model_input = ModelInput::Text;
            a.needs = Some(vec![vec![WorkerType::Decode]]);
        },
        "model_input",
    );
    check(
        |a| {
            a.worker_type = Some(WorkerType::Prefill);
            a.needs = Some(vec![vec![WorkerType::Decode]]);
        },
        "model_type",
    );
    check(|a| a.worker_type = Some(WorkerType::Decode), "needs");
    check(
        |a| {
            a.worker_type = Some(WorkerType::Decode);
            a.needs = Some(vec![vec![]]);
        },
        "needs",
    );
    check(
        |a| a.tensor_model_config = Some(serde_json::json!({})),
        "tensor_model_config",
    );
    check(|a| a.lora_name = Some("x".into()), "base_model_path");
    check(|a| a.kv_cache_block_size = Some(0), "kv_cache_block_size");
    check(
        |a| a.custom_template_path = Some("/no/template.jinja".into()),
        "/no/template.jinja",
    );
    check(|a| a.model_path = "/no/such/model".into(), "/no/such/model");
    check(
        |a| {
            a.runtime_config = Some(ModelRuntimeConfig {
                data_parallel_size: 0,
                ..Default::default()
            })
        },
        "data_parallel_size",
    );

    // Valid disaggregated and legacy-prefill registrations.
    let mut a = args(ModelType::PREFILL);
    a.worker_type = Some(WorkerType::Prefill);
    a.needs = Some(vec![vec![WorkerType::Decode]]);
    assert_eq!(
        a.build_card().expect("prefill").worker_type,
        WorkerType::Prefill
    );
}

#[test]
fn register_lora_and_tensor_models() {
    let mut a = args(ModelType::CHAT);
    a.model_path = "ignored-for-lora".into();
    a.lora_name = Some("my-adapter".into());
    a.base_model_path = Some(tiny_model_dir().display().to_string());
    a.max_gpu_lora_count = Some(4);
    let card = a.build_card().expect("lora");
    assert_eq!(card.name(), "my-adapter");
    assert_eq!(
        card.lora.as_ref().map(|l| l.max_gpu_lora_count),
        Some(Some(4))
    );

    let mut t = args(ModelType::TENSOR_BASED);
    t.model_path = "not/a/dir".into();
    t.model_name = Some("tensor-model".into());
    t.tensor_model_config = Some(serde_json::json!({"name": "x"}));
    t.model_aliases = vec!["alias".into()];
    let card = t.build_card().expect("tensor");
    assert_eq!(card.name(), "tensor-model");
    assert!(card.tokenizer.is_none() && card.model_aliases.is_empty());
}

#[test]
fn custom_template_is_checksummed() {
    let dir = std::env::temp_dir().join(format!("dynamo-tmpl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let p = dir.join("t.jinja");
    std::fs::write(&p, "{{ messages[0].content }}").expect("write");
    let mut a = args(ModelType::CHAT);
    a.custom_template_path = Some(p.clone());
    let card = a.build_card().expect("card");
    assert_eq!(card.chat_template_file.as_ref().map(|f| f.size), Some(25));
}
