//! Path confinement properties: no input resolves outside the root; normalising twice changes
//! nothing; whatever `relative_components` accepts stays beneath any root.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use smithers_paths::{is_within, normalize_lexically, relative_components, resolve};

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("..".to_string()),
        Just(".".to_string()),
        Just("".to_string()),
        Just("...".to_string()),
        Just("..x".to_string()),
        "[a-z]{1,3}",
        "[a-z.]{1,4}",
        "\\PC{1,3}",
    ]
}

fn untrusted_path() -> impl Strategy<Value = String> {
    (any::<bool>(), prop::collection::vec(segment(), 0..8)).prop_map(|(abs, segs)| {
        let joined = segs.join("/");
        if abs {
            format!("/{joined}")
        } else {
            joined
        }
    })
}

fn root() -> impl Strategy<Value = PathBuf> {
    prop_oneof![
        Just(PathBuf::from("/")),
        Just(PathBuf::from("/root/dir")),
        Just(PathBuf::from("/a/b/c/")),
        Just(PathBuf::from("/work/proj/../proj2")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn nothing_resolves_outside_the_root(root in root(), input in untrusted_path()) {
        if let Ok(resolved) = resolve(&root, &input) {
            let norm_root = normalize_lexically(&root);
            prop_assert!(is_within(&norm_root, &resolved), "{input:?} -> {resolved:?}");
            prop_assert!(resolved.is_absolute());
            prop_assert!(!resolved.components().any(|c| matches!(c, std::path::Component::ParentDir | std::path::Component::CurDir)));
        }
    }

    #[test]
    fn normalising_is_idempotent(input in untrusted_path()) {
        let once = normalize_lexically(Path::new(&input));
        let twice = normalize_lexically(&once);
        prop_assert_eq!(once, twice);
    }

    #[test]
    fn resolving_a_resolved_path_is_a_fixed_point(root in root(), input in untrusted_path()) {
        if let Ok(resolved) = resolve(&root, &input) {
            let again = resolve(&root, resolved.to_str().unwrap()).unwrap();
            prop_assert_eq!(resolved, again);
        }
    }

    #[test]
    fn accepted_relative_components_stay_beneath(input in untrusted_path()) {
        if let Ok(parts) = relative_components(Path::new(&input)) {
            let root = Path::new("/r");
            let joined: PathBuf = std::iter::once(root.as_os_str()).chain(parts.iter().copied()).collect();
            prop_assert!(is_within(root, &normalize_lexically(&joined)));
            prop_assert!(normalize_lexically(&joined) != root);
        }
    }
}
